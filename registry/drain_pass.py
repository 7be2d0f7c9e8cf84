"""A drain pass: the attempts of one claim of registrations (odal.work.passes), and what it counts.

A pass has up to ODAL_REGISTRY_CONCURRENCY calls in flight, each on a thread of the run's pool
and each sent when the registry's pace allows (registry.pace: the deployment's rate limit, and the
pauses a 429 asks for). Only the pass's own thread touches the database, as in the outbox's
sweep: it decides what each row owes before its call goes out (a passport withdrawn meanwhile
is sent nothing), and writes the endings several at a time, in one transaction, each by the
guarded write of the pass's claim (registry.settling).
"""

import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.conf import settings

from odal.core import reconnect
from odal.core.models import Passport
from odal.core.text import error_text
from odal.work import deadline as task_deadline
from odal.work.loops import Report
from odal.work.passes import Pass
from odal.work.settle import settle
from registry import adapters
from registry.calls import GIVEN_BACK, WITHDRAWN, Ask, CallResult, send_in_turn
from registry.models import Registration
from registry.operations import operation_of, withdraw
from registry.pace import PAUSE_REFRESH_SECONDS, Pace
from registry.settling import REGISTRATIONS, Attempt, Ending

log = logging.getLogger("registry.drain")  # (the drain's lines, wherever written, are the drain's)

FLUSH_ROWS = 100  # outcomes written together, in one transaction
FLUSH_SECONDS = 0.25  # ...or sooner (a quarter of the hold if that is less): a registered row's
# check, and the rows a person waits to see settle, are not held back behind slow requests


@dataclass
class DrainReport(Report):
    submitted: int = 0
    registered: int = 0
    rejected: int = 0
    deactivated: int = 0
    failed: int = 0
    unknown: int = 0  # no answer of the registry's own: the request may have reached it
    rate_limited: int = 0  # the registry answered 429 (attempt given back, due when the pause ends)

    def summary(self) -> str:
        text = (
            f"{self.claimed} claimed, {self.submitted} submitted, {self.registered} registered, "
            f"{self.rejected} rejected, {self.deactivated} deactivated, {self.failed} failed, {self.late} late"
        )
        if self.unknown:
            text += f", {self.unknown} outcome unknown (may still reach the registry)"
        if self.write_errors:
            text += f", {self.write_errors} not written (database refused)"
        text += self.given_back()
        if self.rate_limited:
            text += f", {self.rate_limited} rate-limited (429; given back)"
        return text


def longest_attempt_seconds(*, finds: bool = False) -> float:
    """The longest an attempt of the drain may take: one request (ODAL_REGISTRY_TIMEOUT_SECONDS),
    or, for a deactivation that first finds what the registry holds (registry.finding), the lookup
    of the task list (ODAL_REGISTRY_LOOKUP_SECONDS) then a check and a deactivation of the
    submission it finds (one each; a lookup that finds several makes as many more)."""
    timeout = settings.ODAL_REGISTRY_TIMEOUT_SECONDS
    return settings.ODAL_REGISTRY_LOOKUP_SECONDS + 2 * timeout if finds else timeout


class DrainPass(Pass):
    """The attempts of one claim. Requests go out on the pool, at most ODAL_REGISTRY_CONCURRENCY
    at once, each in a slot of the registry's pace; this thread does the rest (odal.work.passes):
    what each row owes before its request, and its outcome after. No request is started after the
    claim's hold has run out, or while the registry has asked every drain to wait; rows whose
    turn came too late are given back."""

    rows, flush_rows, flush_seconds = Registration.objects, FLUSH_ROWS, FLUSH_SECONDS
    look_seconds = (
        PAUSE_REFRESH_SECONDS  # requests waiting for their slot see a pause or a suspend within this
    )
    not_started_line = (
        "%s claimed registrations not started: the claim's hold ran out first, the registry asked every "
        "drain to wait (429), this process is stopping, or its task's time is up"
    )

    def __init__(self, claim, report: DrainReport, adapter, pace: Pace, pool: ThreadPoolExecutor):
        super().__init__(claim, report)
        self.adapter, self.pace, self.pool = adapter, pace, pool
        self.waiting = deque(claim.rows)
        self.held_until = claim.ends  # (monotonic: the database's hold, as the claim timed it)
        self.no_more_slots = False  # a row's slot came after its deadline: the pass books no more
        self.rechecked_at = float("-inf")

    @property
    def deadline(self) -> float:
        """No request starts after this (time.monotonic()): the claim's hold, or the pass's
        deadline in its task (odal.work.deadline), whichever comes first."""
        return min(self.held_until, self.claim.start_by)

    def longest_attempt(self) -> float:
        return longest_attempt_seconds()  # (a row that finds first has a deadline of its own: begin)

    def guarded(self, attempt: Attempt, step, *args):
        """A step of this thread for one attempt: a bug of ours (or a statement the database
        refused) fails the attempt, not the pass; a lost database ends the pass (odal.core.reconnect)."""
        try:
            return step(attempt, *args)
        except Exception as exc:
            reconnect.raise_if_lost(exc)
            log.exception(
                "registration %s: attempt raised", attempt.reg.pk,
                extra=attempt.ids(),
            )  # fmt: skip
            attempt.failed(attempt.reg.operation, error_text(exc))
            return None

    def start_more(self) -> None:
        while self.waiting and len(self.in_flight) < settings.ODAL_REGISTRY_CONCURRENCY:
            self.begin(self.waiting.popleft())

    def begin(self, reg: Registration) -> None:
        """Plan one row's attempt and put its request on the pool in its slot of the pace; or
        give the row back (not_started); or end the attempt here, if it owes no request."""
        if self.no_more_slots or self.pace.paused_for():
            self.not_started.append(reg.pk)  # the registry asked every drain to wait: given back, not held
            return
        until = self.deadline
        if reg.status == Registration.Status.PENDING and reg.finds_first:
            # Its lookup and requests take longer than one request: it starts only if they can
            # end within its task's time; if not, it is given back for a task with time for it.
            finds_by = task_deadline.start_by(longest_attempt_seconds(finds=True))
            if task_deadline.now() >= finds_by:
                self.report.out_of_time = 1
                self.not_started.append(reg.pk)
                return
            until = min(until, finds_by)
        slot = self.pace.next_slot(until)  # (now, without a rate limit; a withdrawn row's unused)
        if slot is None or slot >= until:
            # The hold has run out, or the task's time will, before this row's turn (the rate
            # limit's schedule has no slot for it before then, and booked none): the row is due
            # again and may be another drain's already. Nothing is sent for it, nor written. Nor
            # for the rows after it, whose turns would come later still: they do not even try to book.
            self.no_more_slots = True
            if (
                until < self.held_until
            ):  # (the task's time, not the hold: its run ends, a fresh task takes them)
                self.report.out_of_time = 1
            self.not_started.append(reg.pk)
            return
        attempt = Attempt(reg, self.claim.token, self.pending)
        plan, settle = operation_of(reg)
        call = self.guarded(attempt, plan)
        if call is not None:
            future = self.pool.submit(send_in_turn, call, self.adapter, self.pace, slot, until)
            self.track(future, reg, (attempt, settle, call))

    def look(self) -> None:
        # Requests waiting for their slot see a pause another process met within this, and
        # registers waiting for theirs a suspend.
        self.pace.paused_for()
        self.recheck_withdrawn()

    def recheck_withdrawn(self) -> None:
        """Registers still waiting for their turn whose passport is no longer published are not
        sent (one read, at most every PAUSE_REFRESH_SECONDS): a suspend committed after the claim
        stops a register that has not gone out yet."""
        now = time.monotonic()
        if now - self.rechecked_at < PAUSE_REFRESH_SECONDS:
            return
        self.rechecked_at = now
        waiting = {
            call.arg.passport_id: call
            for _, (_, _, call) in self.in_flight.values()
            if call.ask is Ask.REGISTER and not call.sending
        }
        if not waiting:
            return
        withdrawn = (
            Passport.objects.filter(pk__in=list(waiting))
            .exclude(status=Passport.Status.PUBLISHED)
            .values_list("pk", flat=True)
        )
        for pk in withdrawn:
            waiting[pk].withdrawn.set()

    def ended(self, reg, job, result: CallResult) -> None:
        attempt, settle, _ = job
        if result is GIVEN_BACK:
            self.not_started.append(reg.pk)
        elif result is WITHDRAWN:
            self.guarded(attempt, withdraw)
        else:
            if isinstance(result.error, adapters.RateLimited):
                self.pace.pause(result.error.retry_after, str(result.error))  # for every drain
            self.guarded(attempt, settle, result)

    def take_waiting(self) -> list:
        waiting = [reg.pk for reg in self.waiting]
        self.waiting.clear()
        return waiting

    def write(self, endings: list[Ending]) -> None:
        written = settle(REGISTRATIONS, endings)
        self.report.write_errors += len(written.refused)
        self.report.late += len(written.late)
        for ending in written.taken:
            if ending.counts:
                setattr(self.report, ending.counts, getattr(self.report, ending.counts) + 1)
