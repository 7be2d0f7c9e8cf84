"""The deadline of the django-q2 task that runs a kind of claimed work (issue 37, item 2).

django-q2 ends a task at its timeout (Q_CLUSTER "timeout", 90 s) by SIGALRM in its worker,
wherever the task's code is: inside an attempt (a consumer called whose outcome is never
written), or a flush. So a pass that runs in a task starts no attempt that could not end, and be
written, before then; past that it gives its rows back as on a stop (odal.work.passes).

- `task()`: around a task's body (odal.work.loops.Work.task). Its deadline is when django-q2's
  alarm goes off: read from the process's real-time timer, which signal.alarm set as the task
  began, so a task's own timeout (async_task's `timeout`) counts too. No alarm, no deadline.
- `start_by(longest)`: the latest a pass of this task may start an attempt that takes up to
  `longest` seconds: the deadline less that and MARGIN_SECONDS. Infinity outside a task (a
  sweep or a drain of its own, `--once`): only the claim's hold bounds its passes.
- `now()`: the clock both are read on (time.monotonic; a test moves it).

The settings must leave a task room for its longest attempt: registry.checks refuses those that do not
(docs/runbook.md, "Task timeouts").
"""

import math
import signal
import time
from contextlib import contextmanager
from contextvars import ContextVar

# After its last attempt ends, what a pass still does before its task returns: write the last
# outcomes, give back what it did not start, and end its run (a leader's unlock and last look).
MARGIN_SECONDS = 5.0

clock = time.monotonic
_deadline: ContextVar[float | None] = ContextVar("odal_task_deadline", default=None)


def now() -> float:
    return clock()


def alarm_seconds() -> float | None:
    """Seconds before this process's alarm (SIGALRM) goes off; None if none is set."""
    try:
        left = signal.getitimer(signal.ITIMER_REAL)[0]
    except (AttributeError, OSError):  # (a platform without it: django-q2 sets no alarm there either)
        return None
    return left or None


@contextmanager
def task(seconds: float | None = None):
    """Within: this thread runs a task that ends in `seconds`; by default when the alarm that
    django-q2 set for it goes off (none set: no deadline)."""
    if seconds is None:
        seconds = alarm_seconds()
    token = _deadline.set(None if seconds is None else now() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


def start_by(longest: float) -> float:
    """The latest now() at which this thread's task may start an attempt of `longest` seconds."""
    deadline = _deadline.get()
    return math.inf if deadline is None else deadline - longest - MARGIN_SECONDS
