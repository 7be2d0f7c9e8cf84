"""Kick an immediate django-q2 task when a commit creates due work, so the work does not wait
for the schedule (whose resolution is a minute). The outbox sweep and the registry drain are
woken the same way (outbox.wake): a NOTIFY to the listener, and a task enqueued only when none
listens and no kick of it is already on its way."""

import logging

from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)


def kick(func: str, name: str, **kwargs) -> bool:
    """Enqueue `func` through django-q2's broker; whether it was."""
    try:
        from django_q.tasks import async_task

        async_task(func, task_name=name, q_options={"save": False}, **kwargs)
    except Exception:  # the schedule will pick the rows up; a kick is an optimisation
        log.warning("could not enqueue %s", func, exc_info=True)
        return False
    return True


def wake_on_commit(wake) -> None:
    """When the commit lands, wake `wake`'s worker (outbox.wake.wake_up)."""
    if settings.ODAL_KICK_SWEEP:
        from outbox.wake import wake_up

        transaction.on_commit(lambda: wake_up(wake))


def wake_sweep() -> None:
    """NOTIFY the listening sweep; only when no sweep is listening, enqueue one (coalesced)."""
    from outbox.wake import SWEEP, wake_up

    wake_up(SWEEP)


def kick_sweep_on_commit() -> None:
    """When the commit lands, wake the sweep (see outbox.wake)."""
    if settings.ODAL_KICK_SWEEP:
        transaction.on_commit(wake_sweep)
