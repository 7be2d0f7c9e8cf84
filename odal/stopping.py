"""Stopping within ODAL_STOP_SECONDS: what SIGTERM and SIGINT do to a long-running odal process
(`odal outbox sweep`, `odal registry drain`, `odal qcluster`, `odal up`).

The first signal asks the process to stop (`requested()`): a sweep or a drain starts no more attempts,
gives its claimed rows not started back, writes the outcomes it has and returns; a process that
has stopped so exits 0. It also starts a clock: should anything still be running when
ODAL_STOP_SECONDS are nearly up (a consumer that does not return, a database that stopped
answering, a cluster waiting for a task), the process ends its own children and exits at once
with 128 + the signal's number (143 after SIGTERM, 130 after SIGINT), saying so in its log. A
second signal does that at once. Rows whose attempt was still running keep their claim until the
hold runs out, and are then due again (at least once: the guarded writes make that safe).

`odal serve` is gunicorn's, whose graceful timeout it sets below ODAL_STOP_SECONDS.
"""

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from django.conf import settings

log = logging.getLogger(__name__)

_requested = threading.Event()
_lock = threading.Lock()
_deadline: float | None = None  # time.monotonic() by which the process has exited


def requested() -> bool:
    """Whether SIGTERM or SIGINT asked this process to stop."""
    return _requested.is_set()


def remaining() -> float | None:
    """Seconds left before the process is ended, once asked to stop; None before."""
    return None if _deadline is None else max(0.0, _deadline - time.monotonic())


def grace_seconds() -> float:
    """How long after the signal the process may take before it is ended: ODAL_STOP_SECONDS,
    less a moment to end its children and flush its log."""
    seconds = settings.ODAL_STOP_SECONDS
    return max(seconds - 1.0, seconds / 2)


def on_signals(then=None) -> None:
    """Handle SIGTERM and SIGINT in this (the main) thread as the module says; `then(signum)`,
    if given, is called on the first one (e.g. to pass it on to children)."""

    def handler(signum, frame):
        if requested():
            end(signum, "a second signal came")
            return
        ask(signum)
        if then is not None:
            then(signum)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def ask(signum: int) -> None:
    """Ask this process to stop and start the clock that ends it."""
    global _deadline
    with _lock:
        if _requested.is_set():
            return
        grace = grace_seconds()
        _deadline = time.monotonic() + grace
        _requested.set()
    name = signal.Signals(signum).name
    log.warning("%s: stopping (within ODAL_STOP_SECONDS, %ss)", name, settings.ODAL_STOP_SECONDS)
    timer = threading.Timer(grace, end, args=(signum, f"still running {grace:g} s after {name}"))
    timer.daemon = True
    timer.start()


def end(signum: int, why: str) -> None:
    """Exit now: children first (a cluster's processes), with 128 + `signum`."""
    log.error(
        "%s; exiting now. Rows whose attempt was still running keep their claim until its hold "
        "runs out, and are then due again.",
        why,
    )
    for child in descendants():
        with contextlib.suppress(ProcessLookupError):  # gone meanwhile
            os.kill(child, signal.SIGKILL)
    for name in ("", "odal", "outbox", "registry"):
        for handler in logging.getLogger(name).handlers:
            handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)


def descendants(pid: int | None = None) -> list[int]:
    """This process's children, theirs, and so on (Linux: read from /proc; elsewhere the
    processes multiprocessing started)."""
    pid = os.getpid() if pid is None else pid
    proc = Path("/proc")
    if not proc.is_dir():
        import multiprocessing

        return [p.pid for p in multiprocessing.active_children()]
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        ppid = int(stat.rpartition(")")[2].split()[1])  # (the name may hold spaces and parentheses)
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
