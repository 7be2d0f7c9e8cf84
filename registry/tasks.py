"""django-q2 task entry points. The schedule (migration registry/0002) runs `drain` every
minute; publishing and suspending wake it at once (odal.work.wake.DRAIN.on_commit): a
NOTIFY to the listening drain, or one task when none listens, however many commits land.

A drain task that takes the drain's listener lock listens for a turn and relays to a successor
while registrations fall due within RELAY_HORIZON (odal.work.wake.run_kicked_task, the sweep's mechanism):
so one django-q2 worker keeps a listening drain while the registry is owed work soon, and a
registration's check or retry is made within about a second of falling due. Rows due later are
the minute's schedule's.
"""

from registry.drain import DRAINING


def drain(relay: bool = False) -> str:
    return DRAINING.task(relay)
