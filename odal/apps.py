from django.apps import AppConfig


class OdalConfig(AppConfig):
    name = "odal"
    verbose_name = "Passports and audit"
