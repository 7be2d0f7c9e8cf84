"""Kick an immediate django-q2 task when a commit creates due work, so the work does not wait
for the schedule (whose resolution is a minute). The outbox sweep and the registry drain are
woken the same way (outbox.wake): a NOTIFY to the listener, and a task enqueued only when none
listens and no kick of it is already on its way."""

import logging
import time

from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)

# After the broker failed a kick, this process sends it none for this long: a Redis that takes
# connections and never answers costs each kick its timeout (5 s), and a web process would pay it
# on every publishing request while the broker is away, for work that the listening workers (a
# NOTIFY needs no broker) and the schedule do anyway.
BROKER_REST_SECONDS = 10.0
_rest_until = float("-inf")  # time.monotonic(): no kick from this process before


def broker_resting() -> bool:
    """Whether a kick the broker failed lately rests this process's kicks."""
    return time.monotonic() < _rest_until


def kick(func: str, name: str, **kwargs) -> bool:
    """Enqueue `func` through django-q2's broker; whether it was. Not tried while the broker
    rests (BROKER_REST_SECONDS after one failed)."""
    global _rest_until
    if broker_resting():
        log.debug("not enqueueing %s: the broker failed a kick lately", func)
        return False
    try:
        from django_q.tasks import async_task

        async_task(func, task_name=name, q_options={"save": False}, **kwargs)
    except Exception:  # the schedule will pick the rows up; a kick is an optimisation
        _rest_until = time.monotonic() + BROKER_REST_SECONDS
        log.warning(
            "could not enqueue %s; this process enqueues no kick for %g s", func, BROKER_REST_SECONDS,
            exc_info=True,
        )  # fmt: skip
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
