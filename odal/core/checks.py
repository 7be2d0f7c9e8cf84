"""What every app's system checks share (their ids, the words of odal.W001), and the refusal of
Django's deploy errors in production (OdalConfig.ready). Each app registers its own checks as it
starts: outbox/checks.py, registry/checks.py."""

from django.core.checks import ERROR
from django.core.checks.registry import registry
from django.core.exceptions import ImproperlyConfigured

W001 = "odal.W001"
E001 = "odal.E001"  # a task's timeout too short for the attempts it runs
E002 = "odal.E002"  # django-q2's retry not longer than its timeout

CONSEQUENCE = (
    "an attempt that takes its whole timeout outlives its claim, the {what} may be sent again "
    "meanwhile, and the late outcome changes nothing (the attempt log keeps it, marked late)"
)


def refuse_deploy_errors() -> None:
    """In production, start only if none of Django's deploy checks (what `check --deploy` runs)
    finds an error: raise ImproperlyConfigured with the first one's sentence, which names its
    setting. Django itself only reports them, and only when asked for --deploy. (Its warnings
    that odal makes refusals, a weak SECRET_KEY and ALLOWED_HOSTS '*', are refused in settings.)"""
    for check in sorted(registry.deployment_checks, key=lambda c: f"{c.__module__}.{c.__qualname__}"):
        for message in check(app_configs=None, databases=None):
            if message.level >= ERROR:
                raise ImproperlyConfigured(
                    f"{message.msg} ({message.id}: Django's deploy check calls it an error; "
                    "ODAL_ENV=production does not start with one)"
                )
