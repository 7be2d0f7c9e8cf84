"""django-q2 task entry points. The schedules run `sweep` every minute (migration outbox/0002)
and `purge` every 10 minutes (outbox/0007, retention); a commit that creates deliveries wakes the
listening sweep, or enqueues `sweep` when no sweep listens (outbox.kick, outbox.wake).

A sweep task that takes the listener lock listens for TURN_SECONDS, then hands over to a
successor it enqueues itself (a relay), as long as there is pending work: so one django-q2
worker keeps a listening sweep while deliveries are pending, and a retry falling due is attempted
within about a second. Turns are short so that stopping the cluster never waits long for one.
"""

from django.conf import settings

from outbox import retention
from outbox.kick import kick
from outbox.models import Delivery
from outbox.sweep import SweepReport, sweep_listening, sweep_until_idle
from outbox.wake import Listener

TURN_SECONDS = 10.0
HANDOVER_SECONDS = 1.0  # the predecessor keeps sweeping while its successor starts
SUCCESSOR_WAIT_SECONDS = 5.0  # how long a successor waits for its predecessor's lock


def sweep(relay: bool = False) -> str:
    # With a single worker a listening sweep would keep the registry drain waiting.
    if settings.Q_CLUSTER.get("workers", 1) < 2:
        return sweep_until_idle(max_seconds=50).summary()
    listener = Listener.open()
    if listener is None:
        return sweep_until_idle(max_seconds=50).summary()
    with listener:
        if not (listener.try_lead() or (relay and listener.wait_to_lead(SUCCESSOR_WAIT_SECONDS))):
            listener.close()  # another sweep listens: help with what is due, then make way
            return sweep_until_idle(max_seconds=50).summary()
        report = listen_one_turn(listener)
    return report.summary()


def purge() -> str:
    """Retention, every 10 minutes (migration outbox/0007): see outbox.retention."""
    return retention.scheduled_purge()


def listen_one_turn(listener: Listener, *, turn_seconds: float = TURN_SECONDS) -> SweepReport:
    report = sweep_listening(listener, seconds=turn_seconds)
    if settings.ODAL_KICK_SWEEP and (report.claimed or Delivery.objects.filter(status="pending").exists()):
        kick("outbox.tasks.sweep", "outbox sweep (relay)", relay=True)
        report.add(sweep_listening(listener, seconds=HANDOVER_SECONDS))
    return report
