"""One pass of claimed work: the attempts of one claim.

The pass's own thread starts attempts on a pool as far as the kind's bounds allow, waits for
them to end, and writes their outcomes a set at a time (FLUSH: so many, or so often, whichever
comes first), each by the guarded write of the pass's claim. It is the only thread that writes,
so a pass holds one database connection however many requests it has in flight. Rows whose
attempt never started (their turn came after the claim's hold ran out, the kind held them back,
the process is stopping, the pass's task is running out of time) are given back, their counted
attempt returned, on every way out of the pass: `run`'s `finally`, and at once when the process
is asked to stop or the pass's deadline for starting attempts comes (odal.work.deadline: in a
django-q2 task, no attempt starts that could not end, and be written, before the task's timeout).

A kind (outbox.sweep, registry.drain) subclasses Pass and says how its rows start
(`start_more`), what an ended attempt leaves to write (`ended`) and how a set is written
(`write`, with `write_in_sets`).
"""

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from concurrent.futures import CancelledError, Future, InvalidStateError

from django.conf import settings
from django.db import transaction

from odal.core import reconnect, stopping
from odal.work import deadline

log = logging.getLogger(__name__)


def write_in_sets(items: list, write, refused) -> list:
    """Write `items` in one transaction (`write(items)` says, per item, whether its guarded write
    took its row). If the database refuses the set, each is written again in a transaction of its
    own (a set of one too: what the database refused may have been passing, a deadlock), so one
    row it cannot store costs no other row its outcome; for that one `refused(item, exc)` is
    called (it keeps its claim until the hold runs out, then it is due again) and its answer is
    None. If the database is lost meanwhile, DatabaseLost unwinds the pass: nothing
    more is written for its claim, and its rows are due again after the hold (odal.core.reconnect)."""
    if not items:
        return []
    try:
        with transaction.atomic():
            return write(items)
    except Exception as exc:  # DataError, or psycopg refusing to encode: see which row, below
        reconnect.raise_if_lost(exc)
        log.warning("writing %s outcomes together failed; writing them one by one", len(items), exc_info=True)
    taken = []
    for item in items:
        try:
            with transaction.atomic():
                taken += write([item])
        except Exception as exc:
            reconnect.raise_if_lost(exc)
            refused(item, exc)
            taken.append(None)
    return taken


class AttemptFuture:
    """What concurrent.futures.Future is to a pass, for an attempt its own runner starts (the
    sweep's Python consumers and webhooks: one future per claimed row), without a Condition made for each
    (a lock and a Condition per Future were a tenth of a no-op pass of 500). The states, their
    moves and their answers are Future's; one lock, shared, guards every move (a move is a few
    instructions). Nothing waits on one: the pass learns that it ended from its callback
    (Pass.track) and asks its result only then."""

    __slots__ = ("_state", "_result", "_exception", "_callbacks")
    _lock = threading.Lock()

    def __init__(self):
        self._state, self._result, self._exception, self._callbacks = "PENDING", None, None, []

    def set_running_or_notify_cancel(self) -> bool:
        with self._lock:
            if self._state == "CANCELLED":
                return False
            if self._state != "PENDING":
                raise RuntimeError(f"Future in unexpected state: {self._state}")  # (Future's error)
            self._state = "RUNNING"
            return True

    def cancel(self) -> bool:
        with self._lock:
            if self._state in ("RUNNING", "FINISHED"):
                return False
            if self._state == "CANCELLED":
                return True
            self._state = "CANCELLED"
        self._ended()
        return True

    def set_result(self, result) -> None:
        self._finish(result, None)

    def set_exception(self, exception: BaseException) -> None:
        self._finish(None, exception)

    def _finish(self, result, exception) -> None:
        with self._lock:
            if self._state in ("CANCELLED", "FINISHED"):
                raise InvalidStateError(f"{self._state}: already ended")
            self._state, self._result, self._exception = "FINISHED", result, exception
        self._ended()

    def _ended(self) -> None:
        for callback in self._callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("a callback of an attempt's future raised")
        self._callbacks = []

    def add_done_callback(self, callback) -> None:
        with self._lock:
            if self._state not in ("CANCELLED", "FINISHED"):
                self._callbacks.append(callback)
                return
        try:
            callback(self)
        except Exception:
            log.exception("a callback of an attempt's future raised")

    def done(self) -> bool:
        return self._state in ("CANCELLED", "FINISHED")

    def cancelled(self) -> bool:
        return self._state == "CANCELLED"

    def result(self):
        """Its result (or its exception, raised), once it ended; asked before, it is an error
        (nothing waits on one)."""
        if self._state == "CANCELLED":
            raise CancelledError()
        if self._state != "FINISHED":
            raise InvalidStateError("not ended: nothing waits on an attempt's future")
        if self._exception is not None:
            raise self._exception
        return self._result


class Pass(ABC):
    """The attempts of one claim (see the module). Subclasses set the class attributes and write
    `start_more`, `ended` and `write`; `look` and `take_waiting` have defaults."""

    rows = None  # the claimed model's manager (a ClaimQuerySet): what not_started is given back to
    flush_rows: int  # outcomes written together, in one transaction
    flush_seconds: float  # ...or sooner (a quarter of the hold if that is less)
    look_seconds: float  # the longest the pass waits for an attempt to end before it looks up
    not_started_line: str  # the log line (with the count) when rows are given back

    def __init__(self, claim, report):
        self.claim, self.report = claim, report
        self.in_flight: dict[Future, tuple] = {}  # future -> (row, what `ended` needs): see track
        self.ends: deque = deque()  # futures of in_flight as they end (their callbacks append them)
        self.bell = threading.Event()  # rung when the pass's thread should look at them (see track)
        self.counting = threading.Lock()
        self.quiet_left = 0  # quiet attempts tracked that have not ended
        self.not_started: list = []  # rows' primary keys, to give back
        self.pending: list = []  # ended attempts' outcomes, to write
        self.flushed_at = time.monotonic()
        # Outcomes must be written well inside the claim's hold, or they arrive late for nothing.
        self.flush_seconds = min(self.flush_seconds, settings.ODAL_CLAIM_HOLD_SECONDS / 4)

    def longest_attempt(self) -> float:
        """The longest (in seconds) an attempt of this pass may take: its timeout. No attempt
        starts later than its task's deadline less this (odal.work.deadline)."""
        return 0.0

    @abstractmethod
    def start_more(self) -> None:
        """Start what the kind's bounds allow now (`in_flight`), or give rows back (`not_started`)."""

    @abstractmethod
    def ended(self, row, job, result) -> None:
        """An attempt's future ended with `result`: add its outcome to `pending`, or its row to
        `not_started` if it never started."""

    @abstractmethod
    def write(self, items: list) -> None:
        """Write a set of outcomes and count them in the report."""

    def look(self) -> None:
        """Between waits: what the kind re-reads while attempts run (by default nothing)."""
        return None

    def take_waiting(self) -> list:
        """The rows not started yet, taken off the kind's queues (stopping: they are given back)."""
        return []

    def track(self, future: Future, row, job=None, *, quiet: bool = False) -> None:
        """An attempt started (or queued) on a pool: the pass waits for its future to end. A
        `quiet` one wakes the pass's thread only once every quiet attempt tracked has ended, or
        flush_rows have (or at its next look, within look_seconds): attempts that a runner of
        their own starts one after another (the webhooks' loop, the Python consumers' thread)
        need the pass only to write their outcomes, and waking it for each cost the process two
        thread switches per attempt, and the runner the GIL meanwhile."""
        self.in_flight[future] = (row, job)
        if quiet:
            with self.counting:
                self.quiet_left += 1
        future.add_done_callback(self.ended_quietly if quiet else self.ended_aloud)

    def ended_aloud(self, future) -> None:
        self.ends.append(future)
        self.bell.set()

    def ended_quietly(self, future) -> None:
        self.ends.append(future)
        with self.counting:
            self.quiet_left -= 1
            ring = self.quiet_left == 0 or len(self.ends) >= self.flush_rows
        if ring:
            self.bell.set()

    def wait_ended(self, timeout: float) -> list[Future]:
        """The futures of in_flight that ended, waiting up to `timeout` for the bell (see track).
        A deque their callbacks fill, not concurrent.futures.wait: that one hooks every future in
        flight on each call, and a pass that waits once per ending attempt of 500 would do it 500
        times."""
        deadline = time.monotonic() + timeout
        while not self.ends:
            left = deadline - time.monotonic()
            if left <= 0 or not self.bell.wait(left):
                break
            self.bell.clear()  # (rung for futures already taken: wait again)
        self.bell.clear()
        ended = []
        while self.ends:
            ended.append(self.ends.popleft())
        return [future for future in ended if future in self.in_flight]  # (not one cancelled and given back)

    def out_of_time(self) -> bool:
        """Whether the pass's deadline for starting attempts has come (its task's, less its
        longest attempt: odal.work.deadline); the report says so, and its run starts no more passes."""
        if deadline.now() < self.claim.start_by:
            return False
        self.report.out_of_time = 1
        return True

    def run(self) -> None:
        self.claim.start_by = min(self.claim.start_by, deadline.start_by(self.longest_attempt()))
        try:
            self.start_more()
            while self.in_flight:
                self.look()
                done = self.wait_ended(self.look_seconds)
                for future in done:
                    row, job = self.in_flight.pop(future)
                    self.ended(row, job, future.result())
                # Written, and a stop looked at, before anything more starts: a consumer the
                # flush's bookkeeping paused, or a process asked to stop, starts nothing more.
                if self.pending and (
                    not done
                    or len(self.pending) >= self.flush_rows
                    or time.monotonic() - self.flushed_at >= self.flush_seconds
                ):
                    self.flush()
                if stopping.requested() or self.out_of_time():
                    self.give_back_unstarted()
                self.start_more()
        finally:
            # Whatever stopped the pass: attempts not begun are given back, queued or on the pool;
            # outcomes already known are written, not thrown away (unless the database was lost
            # while writing them: then nothing more is, see flush); an attempt still running
            # keeps its claim.
            self.not_started += self.take_waiting()
            self.not_started += [row.pk for future, (row, _) in self.in_flight.items() if future.cancel()]
            if self.not_started:
                self.out_of_time()  # (given back because the task's time ran out: the report says so)
            self.flush()
            self.release()

    def flush(self) -> None:
        # Taken off first (in place: a kind's attempts may hold the list): a flush that lost the
        # database (DatabaseLost) is not written again by the pass's last flush.
        items = list(self.pending)
        self.pending.clear()
        self.flushed_at = time.monotonic()
        if items:
            self.write(items)

    def give_back_unstarted(self) -> None:
        """Stopping while attempts still run: the rows queued behind them, and those whose future
        has not started, are given back now, not when the running ones end, which may be after
        odal.core.stopping's clock has ended the process (their claim would then hold them, each
        with an attempt counted that was never made)."""
        self.not_started += self.take_waiting()
        for future, (row, _) in list(self.in_flight.items()):
            if future.cancel():
                del self.in_flight[future]
                self.not_started.append(row.pk)
        self.release()

    def release(self) -> None:
        """Give the rows not started back: their counted attempt returned, due again at once
        (unless another claimer took them meanwhile)."""
        if not self.not_started:
            return
        self.report.not_started += len(self.not_started)
        self.rows.filter(pk__in=self.not_started).release(token=self.claim.token)
        log.warning(self.not_started_line, len(self.not_started))
        self.not_started.clear()
