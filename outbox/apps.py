from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Event outbox"

    def ready(self):
        from odal.metrics import register
        from outbox.metrics import OutboxCollector

        register(OutboxCollector())
