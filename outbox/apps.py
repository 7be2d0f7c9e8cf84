from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Event outbox"

    def ready(self):
        # Imported here: apps.py loads before the models, which these modules import.
        from odal.core.metrics import register
        from outbox.checks import register_checks
        from outbox.metrics import OutboxCollector

        register(OutboxCollector())
        register_checks()  # odal.W001 of consumers, on every start and in `odal check`
