from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Registry outbox"

    def ready(self):
        # Imported here: apps.py loads before the models, which these modules import.
        from odal.core.metrics import register
        from registry.checks import register_checks
        from registry.metrics import RegistryCollector
        from registry.retention import add_to_purges

        register(RegistryCollector())
        add_to_purges()
        register_checks()  # odal.W001 of the drain, odal.E001 and E002, on every start and in `odal check`
