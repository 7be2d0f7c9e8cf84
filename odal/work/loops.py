"""The runs of passes, written once for every kind of claimed work (the sweep, the drain).

A kind is a `Work`: it says what one pass of it does (`one_pass`), what a run of passes shares
(`tools`: an HTTP client, a pool), and how a woken task knows whether work is owed (`owed`,
`due`). Its runs are these methods:

- `until_idle`: passes until one claims nothing (lingering for rows falling due within
  `linger_seconds`, or for a pause the kind asks for), for at most `max_seconds`; what a task
  that cannot lead, and `--once`, run.
- `listening`: passes back to back while they find work; when one finds none, wait for a NOTIFY
  or the poll; for `seconds` or until told to stop. What a leading task runs for its turn.
- `forever`: `listening` on a listener of its own, until told to stop (`odal outbox sweep`,
  `odal registry drain`).
- `task`: the body of the django-q2 task a kick enqueues (odal.work.wake.run_kicked_task).

Every run rides out a lost database (odal.core.reconnect): it waits for it, reopens its listener and
goes on; a run with a deadline gives up at the deadline. Every run starts no more passes once
its process is asked to stop (odal.core.stopping: in `odal qcluster`, its main process), nor after a
pass met its task's deadline (odal.work.deadline).
"""

import time
from abc import ABC, abstractmethod
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, fields

from django.conf import settings
from django.db import close_old_connections, connection

from odal.core import reconnect, stopping
from odal.work.deadline import task as task_deadline
from odal.work.wake import POLL_SECONDS, Listener, Wake, open_listener, run_kicked_task, wake_up

# How long a task that cannot lead makes passes (`until_idle`): its run's budget. A pass started
# near its end still starts no attempt past its task's deadline (odal.work.deadline), and the run's
# waits (for rows falling due, for a lost database) end with it: django-q2's timeout must exceed it
# by MARGIN_SECONDS (registry.checks).
TASK_SECONDS = 50.0


@dataclass
class Report:
    """What a run of passes did: the counts every kind has; each kind adds its own."""

    claimed: int = 0
    late: int = 0  # outcomes whose write took nothing: their claim was superseded, or the row settled
    write_errors: int = 0  # outcomes the database refused (each in the attempt log)
    not_started: int = 0  # claimed, but given back before their attempt started
    passes: int = 0
    out_of_time: int = 0  # passes that met their task's deadline (odal.work.deadline): the run ends

    def add(self, other: "Report") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class Work(ABC):
    """One kind of claimed work, as the runs see it. Subclasses set the class attributes and
    write `one_pass`; the rest has defaults."""

    name: str  # "outbox sweep": in logs and in the outage messages
    wake: Wake
    Report: type[Report]
    rows = None  # the claimed model's manager (a ClaimQuerySet)
    batch: int  # rows a pass claims
    linger_seconds: float = 0.0  # until_idle waits for rows falling due this soon
    claimed: bool = False  # whether a pass of the current (or last) `listening` run claimed anything

    @contextmanager
    def tools(self):
        """What a run of passes shares (a client, a pool), as keyword arguments of `one_pass`."""
        yield {}

    @abstractmethod
    def one_pass(self, *, batch: int, **tools) -> Report:
        """One pass of this kind: claim up to `batch` rows and run them, with the run's `tools`."""

    def paused_for(self, tools: dict) -> float:
        """Seconds every worker of this kind must wait before claiming again (none: 0)."""
        return 0.0

    @abstractmethod
    def owed(self) -> bool:
        """Whether a leading task hands over to a successor at the end of its turn."""

    def relay_owed(self) -> bool:
        """A leader's question at the end of its turn: relay if its passes claimed anything this
        turn, or if work is `owed()`. On a steady trickle every row may be settled at
        the moment of asking; a leader that did not relay then left nobody listening until the
        next commit's task started (200 ms of commits unswept at 50 events/s)."""
        return self.claimed or self.owed()

    def due(self) -> bool:
        """Whether anything is due now: a leader's last look."""
        return self.rows.due().exists()

    def until_idle(
        self,
        *,
        batch: int | None = None,
        max_seconds: float = 50.0,
        linger_seconds: float | None = None,
        while_full: bool = False,
    ) -> Report:
        """Passes until one claims nothing and nothing falls due within `linger_seconds` (nor
        does the kind ask to pause), or `max_seconds` have gone by. A database lost meanwhile is
        waited for until then; past it, its error is raised. `while_full`: a helper beside a
        leader, which stops at the first pass that claims less than a full batch (no backlog:
        the leader keeps up); on a steady trickle a helper that waited for idle would keep its
        worker for max_seconds, and a leader's relay successor would find no worker to start on."""
        linger = self.linger_seconds if linger_seconds is None else linger_seconds
        report = self.Report()
        deadline = time.monotonic() + max_seconds
        outage = reconnect.Outage(self.name, deadline=deadline)
        with self.tools() as tools:
            while not stopping.requested():
                one = outage.attempt(lambda: self.one_pass(batch=batch or self.batch, **tools))
                if one is None:
                    continue
                report.add(one)
                if one.out_of_time or time.monotonic() >= deadline:
                    return report
                if while_full and one.claimed < (batch or self.batch):
                    return report
                if one.claimed:
                    continue
                wait = self.idle_wait(tools, linger)
                if wait is None:
                    return report
                stopping.sleep(min(wait, max(0.0, deadline - time.monotonic())))
            return report

    def idle_wait(self, tools: dict, linger: float) -> float | None:
        """After a pass that claimed nothing: how long until there may be more (a pause the kind
        asked for, or a row falling due within `linger`), or None when the run is done."""
        if paused := self.paused_for(tools):
            return paused
        if linger <= 0:
            return None
        upcoming = self.rows.seconds_to_next_due(linger)  # (by the database's clock)
        return None if upcoming is None else max(0.05, upcoming)

    def listening(
        self,
        listener: Listener | None,
        *,
        batch: int | None = None,
        seconds: float | None = None,
        poll_seconds: float = POLL_SECONDS,
        should_stop=lambda: False,
        lead=None,
    ) -> Report:
        """Passes back to back while they claim something; when one claims nothing, wait for a
        NOTIFY (a commit created work) or `poll_seconds` (a retry may have fallen due), whichever
        comes first (without a listener, outside PostgreSQL, just sleep). Runs for `seconds`, or
        until `should_stop()`. A lost database (its own connection or the listener's) is waited
        for, the listener reopened, and the passes go on; if it does not answer within
        `seconds`, this returns what it did. `lead()`, if given (a relay successor waiting for
        its predecessor's lock), is asked after the run's tools are made and one pass has run
        beside the leader (claims take turns safely; the run's first pass is its slowest: its
        housekeeping, its first requests' connections): if it says no, no more passes run."""
        report = self.Report()
        self.claimed = False
        with self.tools() as tools:
            if lead is not None and not stopping.requested():
                try:
                    report.add(self.one_pass(batch=batch or self.batch, **tools))
                except reconnect.ERRORS as exc:
                    if not reconnect.is_lost(exc):
                        raise
                if not lead():
                    return report
            deadline = None if seconds is None else time.monotonic() + seconds
            outage = reconnect.Outage(
                self.name, should_stop=should_stop, deadline=deadline, reopen=listener and listener.reopen
            )
            while not (should_stop() or stopping.requested()):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                try:
                    if not connection.in_atomic_block:  # (a caller's transaction, e.g. a test's, stays open)
                        close_old_connections()  # a long-lived loop drops a connection past its age or broken
                    one = self.one_pass(batch=batch or self.batch, **tools)
                    report.add(one)
                    self.claimed = self.claimed or one.claimed > 0
                    if one.out_of_time:
                        break  # (its task's time is up: the rows it gave back go to another, below)
                    if one.claimed == 0 and not should_stop():
                        pause = poll_seconds if remaining is None else min(poll_seconds, remaining)
                        if listener is not None:
                            listener.wait(pause)
                        else:
                            time.sleep(pause)
                except reconnect.ERRORS as exc:
                    if not reconnect.is_lost(exc):
                        raise
                    if not outage.wait(exc):
                        break
        return report

    def forever(
        self, *, batch: int | None = None, idle_sleep: float = POLL_SECONDS, should_stop=lambda: False
    ) -> Report:
        """Passes until told to stop, woken by commits when idle. It takes the listener lock
        when free, so commits need not enqueue django-q2 tasks meanwhile. A lost database is
        waited for, however long, and the passes go on; one that is down when it starts, too."""
        with open_listener(self.wake, should_stop=should_stop) or nullcontext() as listener:
            return self.listening(listener, batch=batch, poll_seconds=idle_sleep, should_stop=should_stop)

    def task(self, relay: bool = False) -> str:
        """The django-q2 task a kick enqueues: lead and listen for a turn, or do what is due.
        Its passes start no attempt that could not end before django-q2's timeout ends the task
        (odal.work.deadline); rows a pass gave back for that are woken for at once, as a commit's."""
        with task_deadline():
            report = run_kicked_task(
                self.wake,
                relay=relay,
                listening=lambda listener, seconds, should_stop=lambda: False, lead=None: self.listening(
                    listener, seconds=seconds, should_stop=should_stop, lead=lead
                ),
                until_idle=lambda: self.until_idle(max_seconds=TASK_SECONDS),
                helping=lambda: self.until_idle(max_seconds=TASK_SECONDS, while_full=True),
                owed=self.relay_owed,
                due=self.due,
            )
        if report.out_of_time and settings.ODAL_KICK_SWEEP and not stopping.requested():
            wake_up(self.wake)
        return report.summary()
