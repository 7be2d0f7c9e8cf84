from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Registry outbox"

    def ready(self):
        from odal.metrics import register
        from registry.metrics import RegistryCollector
        from registry.retention import add_to_purges

        register(RegistryCollector())
        add_to_purges()
