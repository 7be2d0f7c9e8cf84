"""django-q2 task entry points. The schedules run `sweep` every minute (migration outbox/0002)
and `purge` every 10 minutes (outbox/0007, retention); a commit that creates deliveries wakes the
listening sweep, or enqueues `sweep` when no sweep listens (odal.work.wake, odal.work.wake).

A sweep task that takes the listener lock listens for a turn (odal.work.wake.run_kicked_task), then hands
over to a successor it enqueues itself (a relay), as long as there is pending work: so one
django-q2 worker keeps a listening sweep while deliveries are pending, and a retry falling due is
attempted within about a second. Turns are short so that stopping the cluster never waits long.
"""

from odal.work.wake import SWEEP, run_kicked_task
from outbox import retention
from outbox.models import Delivery
from outbox.sweep import sweep_listening, sweep_until_idle


def sweep(relay: bool = False) -> str:
    return run_kicked_task(
        SWEEP,
        relay=relay,
        listening=lambda listener, seconds: sweep_listening(listener, seconds=seconds),
        until_idle=lambda: sweep_until_idle(max_seconds=50),
        owed=lambda: Delivery.objects.filter(status=Delivery.Status.PENDING).exists(),
        due=lambda: Delivery.objects.due().exists(),
    ).summary()


def purge() -> str:
    """Retention, every 10 minutes (migration outbox/0007): see outbox.retention."""
    return retention.scheduled_purge()
