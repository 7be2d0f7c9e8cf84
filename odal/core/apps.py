from django.apps import AppConfig


class OdalConfig(AppConfig):
    name = "odal.core"
    label = "odal"  # the app's label before the layers: its tables, migrations, permissions, admin URLs
    verbose_name = "Passports and audit"

    def ready(self):
        # Imported here: apps.py loads before the models, which these modules import.
        from django.conf import settings
        from django.contrib import admin
        from django_otp.plugins.otp_static.models import StaticDevice
        from django_otp.plugins.otp_totp.models import TOTPDevice

        from odal.core.admin import check_every_list
        from odal.core.checks import refuse_deploy_errors
        from odal.core.record import superusers_only

        # Every app's admin is registered by now (the admin app's ready came first, and ran autodiscover).
        # A second factor changes only by enrolment and `odal user reset-2fa` (audited), not by
        # django-otp's own device pages.
        admin.site.unregister([TOTPDevice, StaticDevice])
        check_every_list(admin.site)
        superusers_only(admin.site, "django_q")  # its task tables are internals
        if settings.PRODUCTION:
            refuse_deploy_errors()
