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
import ctypes
import itertools
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path

from django.conf import settings

log = logging.getLogger(__name__)

# No lock anywhere on the way in: a signal handler runs in the main thread between two of its
# bytecodes, inside `ask` too (`odal up` asks when a child dies), and would wait for ever for a lock
# that the very thread it interrupted holds. Only assignments, and one next() of a counter (a C
# call: no handler lands inside it), which makes exactly one `ask` the one that counts.
_asked = itertools.count()  # next() is 0 once: for the ask that counts
_here = False  # this process was asked to stop
_shared = None  # share(): the flag that the processes forked afterwards read (a cluster's workers)
_sharer: int | None = None  # the process that made it, the only one whose ask raises it
_deadline: float | None = None  # time.monotonic() by which the process has exited


def requested() -> bool:
    """Whether SIGTERM or SIGINT asked this process to stop, or (in a cluster's processes) its
    main process."""
    return _here or (_shared is not None and _shared.value)


def asked() -> bool:
    """Whether this process itself was asked to stop (a signal to it: a second one ends it)."""
    return _here


def share() -> None:
    """Make the stop one that every process forked from now on sees (`odal qcluster`, before its
    cluster forks): a byte of shared memory, which this process raises when it is asked to stop and
    which `requested()` reads in each of them, lock-free. A process forked from it that is itself
    asked to stop (a worker its sentinel ends) stops alone."""
    global _shared, _sharer
    _shared = multiprocessing.RawValue(ctypes.c_bool, _here)
    _sharer = os.getpid()


def sleep(seconds: float) -> None:
    """time.sleep, ended early once the process is asked to stop (looked at every 0.1 s)."""
    until = time.monotonic() + seconds
    while not requested() and (left := until - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))


def remaining() -> float | None:
    """Seconds left before the process is ended, once asked to stop; None before."""
    return None if _deadline is None else max(0.0, _deadline - time.monotonic())


def grace_seconds() -> float:
    """How long after the signal the process may take before it is ended: ODAL_STOP_SECONDS,
    less a moment to end its children and flush its log."""
    seconds = settings.ODAL_STOP_SECONDS
    return max(seconds - 1.0, seconds / 2)


def on_signals(then=None, signals=(signal.SIGINT, signal.SIGTERM)) -> None:
    """Handle `signals` (SIGTERM and SIGINT) in this (the main) thread as the module says;
    `then(signum)`, if given, is called on the first one (e.g. to pass it on to children)."""

    def handler(signum, frame):
        if asked():  # (in a cluster's worker, its own: the group's signal reaches the main process too)
            end(signum, "a second signal came")
            return
        ask(signum)
        if then is not None:
            then(signum)

    for signum in signals:
        signal.signal(signum, handler)


def ask(signum: int) -> None:
    """Ask this process to stop (and the processes that share its stop) and start the clock that
    ends it. Safe in a signal handler that lands anywhere, inside an `ask` of the same thread too
    (see _asked): that one does it, and the handler's own does nothing."""
    global _here, _deadline
    if next(_asked):
        return  # asked already, or being asked by the code this handler interrupted
    grace = grace_seconds()
    _deadline = time.monotonic() + grace
    _here = True
    if _shared is not None and os.getpid() == _sharer:
        _shared.value = True
    # The clock logs, not the handler: a write to the log inside one the main thread was making
    # is a reentrant call of the same stream.
    threading.Thread(target=_clock, args=(signum, grace), name="odal-stop-clock", daemon=True).start()


def _clock(signum: int, grace: float) -> None:
    name = signal.Signals(signum).name
    log.warning("%s: stopping (within ODAL_STOP_SECONDS, %ss)", name, settings.ODAL_STOP_SECONDS)
    while _deadline is not None and (left := _deadline - time.monotonic()) > 0:
        time.sleep(min(left, 1.0))
    if _deadline is not None:  # (a test that asked puts the deadline back: its clock stands down)
        end(signum, f"still running {grace:g} s after {name}")


def end(signum: int, why: str) -> None:
    """Exit now: children first (a cluster's processes), with 128 + `signum`. Nothing on the way
    can keep it from exiting (in a handler, the log may be a stream the main thread was writing)."""
    with contextlib.suppress(Exception):
        log.error(
            "%s; exiting now. Rows whose attempt was still running keep their claim until its hold "
            "runs out, and are then due again.",
            why,
        )
    for child in descendants():
        with contextlib.suppress(ProcessLookupError):  # gone meanwhile
            os.kill(child, signal.SIGKILL)
    with contextlib.suppress(Exception):
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
