from django.apps import AppConfig


class SignInConfig(AppConfig):
    name = "odal.surfaces.signin"
    label = "odal_signin"
    verbose_name = "Sign-in"

    def ready(self):
        from odal.core.metrics import register
        from odal.surfaces.signin import lockout, pages  # noqa: F401 (their receivers: the lock's audit entry, the session's marks)

        register(lockout.SignInCollector())
