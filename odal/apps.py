from django.apps import AppConfig


class OdalConfig(AppConfig):
    name = "odal"
    verbose_name = "Passports and audit"

    def ready(self):
        from django.conf import settings
        from django.contrib import admin
        from django_otp.plugins.otp_static.models import StaticDevice
        from django_otp.plugins.otp_totp.models import TOTPDevice

        from odal.admin import check_every_list
        from odal.checks import refuse_deploy_errors, register_checks
        from odal.record import superusers_only

        register_checks()  # odal.W001, on every start and in `odal check`
        # Every app's admin is registered by now (the admin app's ready came first, and ran autodiscover).
        # A second factor changes only by enrolment and `odal user reset-2fa` (audited), not by
        # django-otp's own device pages.
        admin.site.unregister([TOTPDevice, StaticDevice])
        check_every_list(admin.site)
        superusers_only(admin.site, "django_q")  # its task tables are internals
        if settings.PRODUCTION:
            refuse_deploy_errors()
