"""Kick an immediate django-q2 task when a commit creates due work, so the work does not wait
for the schedule (whose resolution is a minute). The registry drain uses it too."""

import logging

from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)


def kick(func: str, name: str) -> None:
    try:
        from django_q.tasks import async_task

        async_task(func, task_name=name, q_options={"save": False})
    except Exception:  # the schedule will pick the rows up; a kick is an optimisation
        log.warning("could not enqueue %s", func, exc_info=True)


def kick_on_commit(func: str, name: str) -> None:
    if settings.ODAL_KICK_SWEEP:
        transaction.on_commit(lambda: kick(func, name))


def kick_sweep_on_commit() -> None:
    kick_on_commit("outbox.tasks.sweep", "outbox sweep (kicked)")
