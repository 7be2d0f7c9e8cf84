"""Kick an immediate sweep when a commit creates due deliveries, so delivery does not wait for
django-q2's schedule (whose resolution is a minute)."""

import logging

from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)


def kick_sweep() -> None:
    try:
        from django_q.tasks import async_task

        async_task("outbox.tasks.sweep", task_name="outbox sweep (kicked)", q_options={"save": False})
    except Exception:  # the schedule will pick the rows up; a kick is an optimisation
        log.warning("could not enqueue an immediate outbox sweep", exc_info=True)


def kick_sweep_on_commit() -> None:
    if settings.ODAL_KICK_SWEEP:
        transaction.on_commit(kick_sweep)
