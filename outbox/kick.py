"""Kick an immediate django-q2 task when a commit creates due work, so the work does not wait
for the schedule (whose resolution is a minute). The registry drain uses it too. The outbox
first NOTIFYs the listening sweep and enqueues a task only when none listens (outbox.wake)."""

import logging

from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)


def kick(func: str, name: str, **kwargs) -> None:
    try:
        from django_q.tasks import async_task

        async_task(func, task_name=name, q_options={"save": False}, **kwargs)
    except Exception:  # the schedule will pick the rows up; a kick is an optimisation
        log.warning("could not enqueue %s", func, exc_info=True)


def kick_on_commit(func: str, name: str) -> None:
    if settings.ODAL_KICK_SWEEP:
        transaction.on_commit(lambda: kick(func, name))


def wake_sweep() -> None:
    """NOTIFY the listening sweep; only when no sweep is listening, enqueue one."""
    from outbox.wake import notify_sweep

    if not notify_sweep():
        kick("outbox.tasks.sweep", "outbox sweep (kicked)")


def kick_sweep_on_commit() -> None:
    """When the commit lands, wake the sweep (see outbox.wake)."""
    if settings.ODAL_KICK_SWEEP:
        transaction.on_commit(wake_sweep)
