"""Waking a worker the moment a commit creates due work, and when a retry falls due: the outbox
sweep and the registry drain, each with a Wake of its own (one mechanism, written once).

On PostgreSQL one task at a time per Wake is *the listener*: it holds a session advisory lock on
its own connection, LISTENs on the Wake's channel, and between passes waits for a notification or
for the next poll (at most POLL_SECONDS, so a retry falling due is attempted within about a second
of its next_attempt_at). A commit that creates work sends a NOTIFY; only when no listener holds
the lock does it also enqueue a django-q2 task, and then only if no kick of that task is already
on its way (odal.core.kicks.Kick): however many commits land per second, a worker is woken, not
flooded with tasks.

A task (`run_kicked_task`) that gets the lock listens for a turn of TURN_SECONDS, then, while work is
owed, enqueues its successor (a relay) and keeps working until the successor waits for the lock
(at most HANDOVER_SECONDS), then gives the lock up at once.
A task that cannot get the lock does what is due and returns. On the way out a leader unlocks
*first* and takes its last look at the table *after*: a commit that found the lock held landed
before the unlock, so the last look sees its rows; one that lands later finds the lock free and
enqueues a task itself. (Looking first and unlocking after would leave a moment in which a commit
is neither seen nor kicked, and its rows wait for the minute's schedule.)

The lock is not a correctness lock: the claims decide who does what, and two listeners at once
would do no harm. It only keeps kicks from piling up tasks that would each linger. It lives on the
listener's connection, so a listener that dies (SIGKILL, lost network) gives it up with its
connection.

A listener whose connection is lost (a database restart, a terminated backend) is reopened by
its loop's odal.core.reconnect.Outage once the database answers: it LISTENs again and takes the lock
again if it tried to lead and the lock is free. Meanwhile commits find the lock free and enqueue
tasks, as they do whenever no listener leads.
"""

import logging
import time
from dataclasses import dataclass

import psycopg
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from odal.core import reconnect
from odal.core.kicks import Kick

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0  # the longest a listener waits without looking for rows that fell due
STATEMENT_MARGIN_SECONDS = 2.0  # a listener's own statement bound beside a wait of its own, or on closing
TURN_SECONDS = 10.0  # a leading task's turn; short, so that stopping a cluster never waits long
HANDOVER_SECONDS = 5.0  # the longest a predecessor keeps working for a successor that has not come
SUCCESSOR_WAIT_SECONDS = 5.0  # how long a successor waits for its predecessor's lock
KICK_WINDOW_SECONDS = 10.0  # a kick not started this long after it was enqueued counts as lost: a
# kick whose process or worker died between the mark and the task's start (a cut, a kill; a Redis
# broker drops a task its worker took and never ran) holds commits' kicks back no longer than a
# turn. The price of a kick merely waiting behind busy workers is one more task per window.


@dataclass(frozen=True)
class Wake:
    """What wakes one kind of worker: its NOTIFY channel, its listener lock (a pg advisory lock
    key, per database) and the django-q2 task a kick enqueues."""

    channel: str
    lock: int
    task: str
    name: str

    def on_commit(self) -> None:
        """When the caller's commit lands, wake this kind of worker (wake_up)."""
        if settings.ODAL_KICK_SWEEP:
            transaction.on_commit(lambda: wake_up(self))


# Every kind of claimed work, here together so that no two share a channel or a lock.
SWEEP = Wake("odal_outbox", 0x6F64616C_0001, "outbox.tasks.sweep", "outbox sweep")  # ("odal", 1)
DRAIN = Wake("odal_registry", 0x6F64616C_0002, "registry.tasks.drain", "registry drain")  # ("odal", 2)


# After the broker failed a kick, this process sends it none for this long: a Redis that takes
# connections and never answers costs each kick its timeout (5 s), and a web process would pay it
# on every publishing request while the broker is away, for work that the listening workers (a
# NOTIFY needs no broker) and the schedule do anyway.
BROKER_REST_SECONDS = 10.0
_rest_until = float("-inf")  # time.monotonic(): no kick from this process before


def broker_resting() -> bool:
    """Whether a kick the broker failed lately rests this process's kicks."""
    return time.monotonic() < _rest_until


def kick(func: str, name: str, **kwargs) -> bool:
    """Enqueue `func` through django-q2's broker; whether it was. Not tried while the broker
    rests (BROKER_REST_SECONDS after one failed)."""
    global _rest_until
    if broker_resting():
        log.debug("not enqueueing %s: the broker failed a kick lately", func)
        return False
    try:
        from django_q.tasks import async_task

        async_task(func, task_name=name, q_options={"save": False}, **kwargs)
    except Exception:  # the schedule will pick the rows up; a kick is an optimisation
        _rest_until = time.monotonic() + BROKER_REST_SECONDS
        log.warning(
            "could not enqueue %s; this process enqueues no kick for %g s", func, BROKER_REST_SECONDS,
            exc_info=True,
        )  # fmt: skip
        return False
    return True


def notify(wake: Wake = SWEEP) -> bool:
    """After a commit that created due work: NOTIFY the listener. Returns whether a listener
    holds the lock (if not, the caller enqueues a task). One statement."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_notify(%s, ''), pg_try_advisory_xact_lock_shared(%s)", [wake.channel, wake.lock]
            )
            free = cursor.fetchone()[1]
    except DatabaseError:
        log.warning("could not notify the %s", wake.name, exc_info=True)
        return False
    return not free


def wake_up(wake: Wake) -> None:
    """NOTIFY the listener; only when none listens, enqueue a task, and only if no kick of it is
    already on its way."""
    if notify(wake) or broker_resting():
        return
    now = timezone.now()
    try:
        enqueue = Kick.objects.request(wake.task, now=now, window_seconds=KICK_WINDOW_SECONDS)
    except DatabaseError:  # the schedule will pick the rows up; a kick is an optimisation
        log.warning("could not coalesce the kick of the %s; enqueueing it", wake.name, exc_info=True)
        enqueue = True
    if enqueue and not kick(wake.task, f"{wake.name} (kicked)"):
        try:  # the broker refused it: the next commit tries again
            Kick.objects.withdraw(wake.task, enqueued_at=now)
        except DatabaseError:
            log.warning("could not withdraw the kick of the %s", wake.name, exc_info=True)


class Listener:
    """A connection of its own that LISTENs on a Wake's channel and may hold its listener lock."""

    def __init__(self, wake: Wake = SWEEP):
        self.wake = wake
        self.conn = self._connect()
        self.leading = False
        self.wants_lead = False  # it tried to lead: after a lost connection it tries again

    def _connect(self):
        conn = connection.get_new_connection(connection.get_connection_params())
        conn.autocommit = True
        conn.execute(f"LISTEN {self.wake.channel}")
        return conn

    @classmethod
    def open(cls, wake: Wake = SWEEP) -> "Listener | None":
        return cls(wake)

    def reopen(self) -> str:
        """After its connection was lost (the lock and the LISTEN went with it): a new
        connection that LISTENs again, and takes the lock again if it tried to lead and the lock
        is free. Part of an odal.core.reconnect.Outage: it raises while the database does not answer,
        and says what it does now."""
        self.close()
        self.leading = False
        self.conn = self._connect()
        if self.wants_lead:
            self.try_lead()
        return "listening again, " + (
            "leading" if self.leading else f"not leading (another {self.wake.name} leads)"
        )

    def try_lead(self) -> bool:
        """Take the listener lock if nobody holds it."""
        self.wants_lead = True
        self.leading = self.conn.execute("SELECT pg_try_advisory_lock(%s)", [self.wake.lock]).fetchone()[0]
        return self.leading

    def wait_to_lead(self, seconds: float) -> bool:
        """Wait up to `seconds` for the lock (a relay successor, while its predecessor hands over)."""
        self.wants_lead = True
        ms = int(seconds * 1000)
        try:
            # The server's statement bound (odal.core.database) may be shorter than the wait: it is
            # lengthened for this statement, or it would cancel the wait as an error.
            self.conn.execute(
                "SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false)",
                [f"{ms}ms", f"{ms + int(STATEMENT_MARGIN_SECONDS * 1000)}ms"],
            )
            with self.conn.bounded(seconds + STATEMENT_MARGIN_SECONDS):  # (a bound shorter than the wait)
                self.conn.execute("SELECT pg_advisory_lock(%s)", [self.wake.lock])
            self.leading = True
        except psycopg.errors.LockNotAvailable:  # someone else leads
            self.leading = False
        finally:
            # The session's own (odal.core.database's bounds)
            self.conn.execute("RESET lock_timeout")
            self.conn.execute("RESET statement_timeout")
        return self.leading

    def hand_over(self) -> bool:
        """A predecessor's question between passes: is its successor waiting for the lock? If so,
        give the lock up now, before anything else (the passes end, then the run's tools): the
        successor, blocked in pg_advisory_lock, takes it at once, and no commit meanwhile finds
        nobody listening. Measured at 50 events/s (issue 26): handing over after a fixed second,
        whether the successor had come or not, left a gap of up to 250 ms every turn."""
        if not self.leading:
            return True
        key = self.wake.lock
        try:
            with self.conn.bounded(STATEMENT_MARGIN_SECONDS):
                waiting = self.conn.execute(
                    "SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                    "WHERE l.locktype = 'advisory' AND NOT l.granted AND l.classid = %s AND l.objid = %s "
                    "AND l.objsubid = 1 AND d.datname = current_database())",
                    [(key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF],
                ).fetchone()[0]
        except psycopg.Error:  # its connection lost or silent: the lock goes with it, a successor takes it
            log.debug("a leader could not look for its successor", exc_info=True)
            waiting = True
        if waiting:
            self.close()
        return waiting

    def wait(self, seconds: float) -> bool:
        """Block until a notification arrives or `seconds` pass; True if woken by one. Drains
        the notifications already queued, so a burst of commits wakes the listener once."""
        woken = False
        for _ in self.conn.notifies(timeout=max(0.0, seconds), stop_after=1):
            woken = True
        if woken:
            for _ in self.conn.notifies(timeout=0):
                pass
        return woken

    def close(self) -> None:
        """Give up the lock and stop listening. The lock is released by a statement first: a
        closed connection's backend lets go of it only a moment later, and a last look that
        follows (run_kicked_task) must find it free."""
        try:
            if self.leading and not self.conn.closed:
                self.leading = False
                with self.conn.bounded(
                    STATEMENT_MARGIN_SECONDS
                ):  # a silent database: closing releases it too
                    self.conn.execute("SELECT pg_advisory_unlock(%s)", [self.wake.lock])
        except Exception:  # a broken connection: closing it releases the lock all the same
            log.debug("releasing the listener lock failed", exc_info=True)
        try:
            self.conn.close()
        except Exception:  # pragma: no cover - closing a broken connection
            log.debug("closing the listener connection failed", exc_info=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_listener(wake: Wake = SWEEP, *, should_stop=lambda: False) -> Listener | None:
    """A listener that tries to lead, once the database answers: a worker started while its
    database is down, or on a host cut off from it, waits for it (odal.core.reconnect.Outage) instead
    of exiting. None outside PostgreSQL, or when told to stop while it waited."""
    outage = reconnect.Outage(wake.name, should_stop=should_stop)
    while True:
        listener = None
        try:
            listener = Listener.open(wake)
            if listener is not None:
                listener.try_lead()
            return listener
        except reconnect.ERRORS as exc:
            if listener is not None:
                listener.close()
            if not reconnect.is_lost(exc):
                raise
            if not outage.wait(exc):
                return None


def run_kicked_task(wake: Wake, *, relay: bool, listening, until_idle, owed, due, helping=None):
    """The body of a woken task (outbox.tasks.sweep, registry.tasks.drain); returns its report.

    1. The kick is taken (Kick.started): a commit from now on may enqueue another task.
    2. Lead if nobody does (a relay successor runs a pass, then waits a little for its
       predecessor's lock) and work for a turn, woken by commits: `listening(listener, seconds)`.
       While work is `owed()`, enqueue a successor and keep working until it waits for the lock.
       A task that cannot lead helps while there is a backlog, `helping()` (by default
       `until_idle()`), and returns; every task with one django-q2 worker (a listener would keep
       the other tasks waiting) or off PostgreSQL does what is due, `until_idle()`.
    3. Unlock, then the last look: if anything is `due()` now, wake as a commit would (a new
       task, or whoever leads by then). See the module's docstring for why in this order."""
    if not take_the_kick(wake):
        # Its mark would hold every commit's kick back for KICK_WINDOW_SECONDS (nothing would
        # drain meanwhile): taken once the work below has waited for the database.
        try:
            return until_idle()
        finally:
            take_the_kick(wake)
    if settings.Q_CLUSTER.get("workers", 1) < 2:
        return until_idle()
    try:
        listener = Listener.open(wake)
    except reconnect.ERRORS as exc:
        if not reconnect.is_lost(exc):
            raise
        listener = None  # its own connection failed: do what is due, waiting for the database
    if listener is None:
        return until_idle()
    with listener:
        led = listener.try_lead()

        def lead_after_predecessor() -> bool:
            nonlocal led
            led = listener.wait_to_lead(SUCCESSOR_WAIT_SECONDS)
            return led

        turn = Turn(wake, listener, owed)
        report = None
        if led or relay:
            # One run of passes for the turn and the hand-over: its tools (client, pools) are made
            # once, and no pass is missed between them. A successor waits for its predecessor's
            # lock warmed up (the tools made, a pass run beside the leader): its next pass follows
            # the unlock at once (see Listener.hand_over and the loops' `listening`).
            report = listening(
                listener, TURN_SECONDS + HANDOVER_SECONDS, should_stop=turn,
                lead=None if led else lead_after_predecessor,
            )  # fmt: skip
        if not led:
            listener.close()  # another task listens: help with a backlog, then make way
            helped = (helping or until_idle)()
            if report is not None:
                helped.add(report)
            return helped
        relayed = turn.relayed and not listener.leading  # given to a successor that waited for it
    # The last look, after the unlock (with a successor holding the lock, its next pass is the look;
    # a hand-over that timed out, its successor not waiting yet or given up, looks itself).
    if settings.ODAL_KICK_SWEEP and not relayed and answered_yes(due):
        wake_up(wake)
    return report


class Turn:
    """A leader's `should_stop` for its run of passes: TURN_SECONDS from its first question; then,
    while work is owed, a successor is enqueued (a relay) and the passes go on until it waits for
    the lock (Listener.hand_over, which then gives the lock up), HANDOVER_SECONDS at most."""

    def __init__(self, wake: Wake, listener: "Listener", owed):
        self.wake, self.listener, self.owed = wake, listener, owed
        self.ends_at: float | None = None  # set by the first question (after the lock is taken)
        self.relayed = False
        self.handed_over_by: float | None = None  # set when a successor is enqueued

    def __call__(self) -> bool:
        now = time.monotonic()
        if self.ends_at is None:
            self.ends_at = now + TURN_SECONDS
        if now < self.ends_at:
            return False
        if self.handed_over_by is None:
            self.relayed = (
                self.listener.leading  # (a listener reopened after a loss may find another leading)
                and settings.ODAL_KICK_SWEEP
                and answered_yes(self.owed)
                and kick(self.wake.task, f"{self.wake.name} (relay)", relay=True)
            )
            if not self.relayed:
                return True
            self.handed_over_by = now + HANDOVER_SECONDS
        return now >= self.handed_over_by or self.listener.hand_over()


def take_the_kick(wake: Wake) -> bool:
    """Kick.started for `wake`'s task; False when the database did not take it."""
    try:
        Kick.objects.started(wake.task)
    except DatabaseError:
        log.warning("could not take the kick of the %s", wake.name, exc_info=True)
        return False
    return True


def answered_yes(question) -> bool:
    """A turn's question of the table; a database that does not answer it (lost just then) is
    a no: the next commit, or the schedule, wakes a task instead."""
    try:
        return question()
    except DatabaseError:
        log.warning("a leading turn could not look at its table", exc_info=True)
        return False
