"""django-q2 task entry points. The schedule (migration registry/0002) runs `drain` every
minute; publishing and suspending enqueue it at once (registry.service.kick_drain_on_commit)."""

from registry.drain import drain_until_idle


def drain() -> str:
    return drain_until_idle(max_seconds=50).summary()
