"""django-q2 task entry points. The schedules run `sweep` every minute (migration outbox/0002)
and `purge` every 10 minutes (outbox/0007, the slow housekeeping services); a commit that creates
deliveries wakes the listening sweep, or enqueues `sweep` when no sweep listens (odal.work.wake).

A sweep task that takes the listener lock listens for a turn (odal.work.wake.run_kicked_task), then hands
over to a successor it enqueues itself (a relay), as long as there is pending work: so one
django-q2 worker keeps a listening sweep while deliveries are pending, and a retry falling due is
attempted within about a second. Turns are short so that stopping the cluster never waits long.
"""

from odal.work.services import Due
from outbox import housekeeping
from outbox.sweep import SWEEPING


def sweep(relay: bool = False) -> str:
    return SWEEPING.task(relay)


def purge() -> str:
    """The slow housekeeping services (outbox.housekeeping.SCHEDULED), every 10 minutes
    (migration outbox/0007), and one log line saying what went."""
    return housekeeping.said(Due(housekeeping.SCHEDULED).run())
