"""django-q2 task entry points. The schedule (migration outbox/0002) runs `sweep` every minute;
a commit that creates deliveries enqueues it at once (outbox.kick)."""

from outbox.sweep import sweep_until_idle


def sweep() -> str:
    return sweep_until_idle(max_seconds=50).summary()
