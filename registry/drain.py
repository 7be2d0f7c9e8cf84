"""The registry drain: claim due registrations (the outbox's claim mechanism), ask the registry,
and end each attempt with a guarded write and a line in the attempt log.

Due pending rows register (or deactivate); due submitted rows are checked. Every write is
guarded by the drain's claim and the status it expects, so nothing the drain writes can touch a
row that a person abandoned, or that another attempt settled, while it was asking.

A pass has up to ODAL_REGISTRY_CONCURRENCY requests in flight, each on a thread of the run's pool
and each sent when the registry's pace allows (registry.pace: the deployment's rate limit, and the
pauses a 429 asks for). Only the pass's own thread touches the database, as in the outbox's
sweep: it decides what each row owes before its request goes out (a passport withdrawn meanwhile
is sent nothing), and writes the outcomes several at a time, in one transaction, each by the
guarded write of the pass's claim. So a drain process holds one database connection (and the
listener's), however many requests it has in flight.
"""

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from odal.core import reconnect, stopping, tally
from odal.core.models import Passport
from odal.core.text import error_text, storable
from odal.work import deadline as task_deadline
from odal.work.claims import backoff_delay, database_now
from odal.work.loops import Report, Work
from odal.work.passes import Pass, write_in_sets
from odal.work.wake import DRAIN
from outbox.events import emit_many
from registry import adapters, service
from registry.finding import find_held
from registry.models import NOT_ADOPTED, Registration, RegistrationAttempt
from registry.pace import PAUSE_REFRESH_SECONDS, Pace

log = logging.getLogger(__name__)

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
        if self.not_started:
            why = "given back: the task's time was up" if self.out_of_time else "hold ran out"
            text += f", {self.not_started} not started ({why})"
        if self.rate_limited:
            text += f", {self.rate_limited} rate-limited (429; given back)"
        return text


def next_check_at(attempt: int):
    return timezone.now() + backoff_delay(
        attempt, base_seconds=settings.ODAL_REGISTRY_CHECK_SECONDS, cap_seconds=3600
    )


def registration_event(reg: Registration, event_type: str, **extra) -> tuple[str, dict]:
    """An event about a registration, to emit if its write takes the row."""
    return event_type, {"dppId": str(reg.passport_id), "upi": reg.passport.upi, **extra}


# -- ending an attempt ------------------------------------------------------------------------------


@dataclass
class Settlement:
    """An attempt's outcome, to be written: its guarded write, what follows if the write takes
    the row (an event; a deactivation now owed), the report's count it adds to, and its line in
    the attempt log."""

    attempt: "Attempt"
    operation: str
    outcome: str
    answer: str
    write: Callable[[], bool]
    on_taken: Callable[[], object] | None = None
    on_late: Callable[[], object] | None = None  # in the same transaction, if the write took nothing
    counts: str | None = None
    event: tuple[str, dict] | None = None  # (type, payload), emitted with the run's others
    finished_at: datetime = field(default_factory=timezone.now)  # when the answer came

    def take(self) -> bool:
        took = self.write()
        if took and self.on_taken:
            self.on_taken()
        elif not took and self.on_late:
            self.on_late()
        return took

    def line(self, *, late: bool) -> RegistrationAttempt:
        attempt = self.attempt
        return RegistrationAttempt(
            registration_id=attempt.reg.pk,
            number=attempt.reg.attempts,
            claim_token=attempt.token,
            operation=self.operation,
            started_at=attempt.started_at,
            finished_at=self.finished_at,
            outcome=self.outcome,
            answer=storable(self.answer),
            late=late,
        )


def _write(endings: list[Settlement]) -> list[bool]:
    """The endings' writes, their attempt-log lines (one INSERT) and the events of those that
    took their row (one emit_many per event type), in the caller's transaction; which writes
    took their row."""
    taken = [ending.take() for ending in endings]
    RegistrationAttempt.objects.bulk_create(
        ending.line(late=not took) for ending, took in zip(endings, taken, strict=True)
    )
    events: dict[str, list[dict]] = {}
    for ending, took in zip(endings, taken, strict=True):
        if took and ending.event:
            events.setdefault(ending.event[0], []).append(ending.event[1])
    for event_type, payloads in events.items():
        emit_many(event_type, payloads)
    return taken


def write_endings(endings: list[Settlement]) -> None:
    """Write a run of outcomes with their attempt-log lines, in sets (odal.work.passes.write_in_sets):
    one the database refuses keeps its claim until the hold runs out (then it is due again) and
    its log gets a write_error line instead. An outcome whose write takes no row (its claim was
    superseded, or the row settled) is logged as late and changes nothing else."""
    taken = write_in_sets(endings, _write, lambda ending, exc: ending.attempt.write_error(ending, exc))
    for ending, took in zip(endings, taken, strict=True):
        if took is None:
            continue
        if not took:
            ending.attempt.was_late(ending)
        elif ending.counts:
            report = ending.attempt.report
            setattr(report, ending.counts, getattr(report, ending.counts) + 1)


class Attempt:
    """One claimed row's attempt: ask, then write the outcome and its log line together. A pass
    collects its attempts' outcomes (`endings`) and writes them a run at a time; an attempt on
    its own writes its outcome at once."""

    def __init__(self, reg: Registration, token, report: DrainReport, endings: list | None = None):
        self.reg, self.token, self.report = reg, token, report
        self.started_at = timezone.now()
        self.rows = Registration.objects.filter(pk=reg.pk)
        self.endings = endings

    def finish(
        self,
        operation: str,
        outcome: str,
        answer: str,
        write,
        *,
        on_taken=None,
        on_late=None,
        counts=None,
        event=None,
        finished_at: datetime | None = None,
    ) -> None:
        """End the attempt: `write` (a guarded write, True if it took the row) and the log line
        together, then, in the same transaction, `on_taken` and the `event` (registration_event)
        if it took the row, `on_late` if not, and the report's `counts` plus one."""
        ending = Settlement(
            self, operation, outcome, answer, write, on_taken, on_late, counts, event,
            finished_at or timezone.now(),
        )  # fmt: skip
        if self.endings is None:
            write_endings([ending])
        else:
            self.endings.append(ending)

    def was_late(self, ending: Settlement) -> None:
        self.report.late += 1
        log.warning(
            "late %s answer (%s) for registration %s attempt %s (claim %s): its claim was superseded "
            "or the row settled; nothing written",
            ending.operation,
            ending.outcome,
            self.reg.pk,
            self.reg.attempts,
            self.token,
            extra={"registration": self.reg.pk, "claim": self.token, "attempt": self.reg.attempts},
        )

    def write_error(self, ending: Settlement, exc: Exception) -> None:
        """The database refused this outcome: a write_error line in the attempt log (counted as
        registry_write_errors_total) and the process log say so."""
        self.report.write_errors += 1
        error = (
            f"the registry answered {ending.outcome} ({ending.answer}), but it could not be written: "
            f"{error_text(exc)}"
        )
        ids = {"registration": self.reg.pk, "claim": self.token, "attempt": self.reg.attempts}
        log.error("registration %s %s: %s", self.reg.pk, ending.operation, storable(error), extra=ids)
        try:
            with transaction.atomic():
                refused = Settlement(
                    self, ending.operation, RegistrationAttempt.WRITE_ERROR, error, lambda: False
                )
                refused.line(late=False).save()
        except Exception as exc:
            reconnect.raise_if_lost(exc)
            log.exception(
                "registration %s: not even the attempt-log line could be written", self.reg.pk, extra=ids
            )

    def failed(self, operation: str, error: str) -> None:
        # Every failed attempt, taken or late (a late one gets a line of its own when written).
        log.warning(
            "registration %s %s attempt %s (claim %s) failed: %s",
            self.reg.pk, operation, self.reg.attempts, self.token, storable(error, 200),
            extra={"registration": self.reg.pk, "claim": self.token, "attempt": self.reg.attempts},
        )  # fmt: skip
        retry_at = timezone.now() + backoff_delay(self.reg.attempts)
        self.finish(
            operation, "failed", error,
            lambda: self.rows.mark_attempt_failed(token=self.token, error=error, retry_at=retry_at),
            counts="failed",
        )  # fmt: skip

    def unknown(self, operation: str, error: str) -> None:
        """No answer of the registry's own came back, and the request may have reached it (a
        timeout or a broken connection after sending, a gateway's status, an answer that is not the
        registry's own JSON, whatever its status): it fails and backs off as any failure, and the row remembers when it ended
        (last_unknown_at), so no abandon or suspend takes the task list's silence for proof until
        ODAL_REGISTRY_SETTLE_SECONDS after. A late one (its claim superseded) writes no outcome
        but is remembered all the same: its request may land too."""
        log.warning(
            "registration %s %s attempt %s (claim %s): outcome unknown: %s",
            self.reg.pk, operation, self.reg.attempts, self.token, storable(error, 200),
            extra={"registration": self.reg.pk, "claim": self.token, "attempt": self.reg.attempts},
        )  # fmt: skip
        ended = timezone.now()
        retry_at = ended + backoff_delay(self.reg.attempts)
        self.finish(
            operation, RegistrationAttempt.UNKNOWN, error,
            lambda: self.rows.mark_attempt_failed(token=self.token, error=error, retry_at=retry_at, unknown_at=ended),
            on_late=lambda: self.rows.note_unknown_outcome(at=ended),
            counts="unknown", finished_at=ended,
        )  # fmt: skip

    def rate_limited(self, operation: str, exc: adapters.RateLimited) -> None:
        """The registry answered 429: it acted on nothing, so this attempt does not count against
        the row (it is given back: a rate limit is the registry's state, not the row's; counting
        it would back the row off and call it stalled for no fault of its own). The row is due
        when the pause ends; the attempt log keeps a rate_limited line."""
        retry_at = timezone.now() + timedelta(seconds=exc.retry_after)
        error = storable(exc)
        self.finish(
            operation, RegistrationAttempt.RATE_LIMITED, error,
            lambda: self.rows.mark_rate_limited(token=self.token, error=error, retry_at=retry_at),
            counts="rate_limited",
        )  # fmt: skip


# -- what each operation owes: decided before its request, settled from its answer ---------------------


@dataclass
class Request:
    """The request an attempt sends: which adapter call, with what. A register is sent only
    while its passport is published: `withdrawn` is set (by the pass's thread, which reads the
    passports of the registers waiting for their turn) when it no longer is."""

    call: str  # register, check, deactivate, find (find_held: lookup, check, deactivate)
    arg: object
    withdrawn: threading.Event = field(default_factory=threading.Event)
    sending: bool = False  # past its last look at `withdrawn`

    def send(self, adapter) -> "Reply":
        self.sending = True
        try:
            if self.call == "find":
                return Reply(answer=find_held(adapter, self.arg))
            if self.call == "register":
                return Reply(answer=register(adapter, self.arg))
            return Reply(answer=getattr(adapter, self.call)(self.arg))
        except Exception as exc:  # a Retryable, or a bug of ours: the attempt fails, not the drain
            return Reply(error=exc)


@dataclass
class Reply:
    """What a request got: the registry's answer, or what it raised."""

    answer: object = None
    error: Exception | None = None

    def failed(self, attempt: Attempt, operation: str) -> bool:
        """End the attempt if its request failed (a 429 gives it back); True if it did."""
        if self.error is None:
            return False
        if isinstance(self.error, adapters.RateLimited):
            attempt.rate_limited(operation, self.error)
        elif isinstance(self.error, adapters.OutcomeUnknown):
            attempt.unknown(operation, storable(self.error))
        elif isinstance(self.error, adapters.Retryable):
            attempt.failed(operation, storable(self.error))
        else:
            log.error(
                "registration %s: attempt raised", attempt.reg.pk, exc_info=self.error,
                extra={"registration": attempt.reg.pk, "claim": attempt.token, "attempt": attempt.reg.attempts},
            )  # fmt: skip
            attempt.failed(operation, error_text(self.error))
        return True


@dataclass
class NotAdopted:
    """register answered DUPLICATE_UPI naming `request_id`, whose registration the registry has
    deactivated (`registration_id`): a deactivated registration is not held, so it is not taken
    for this row's."""

    request_id: str
    registration_id: str


def register(adapter, reg: Registration):
    """On a pool thread: the register, and for a DUPLICATE_UPI a check of the request it names
    before it is adopted (NotAdopted if the registry has deactivated its registration). A check
    that fails leaves the duplicate undecided: the attempt fails (the registry kept nothing of
    this register), or is given back if the check was rate-limited."""
    answer = adapter.register(reg)
    if not isinstance(answer, adapters.Duplicate):
        return answer
    try:
        named = adapter.check(answer.request_id)
    except adapters.RateLimited:
        raise
    except adapters.Retryable as exc:
        raise adapters.Retryable(
            f"the registry answered DUPLICATE_UPI naming request {answer.request_id}, and its check failed "
            f"(it is adopted once a check shows it is not deactivated): {exc}"
        ) from None
    if named.status == "registered" and named.deactivated:
        return NotAdopted(answer.request_id, named.registration_id)
    return answer


def plan_register(attempt: Attempt) -> Request | None:
    # The passport's status as committed now (a suspend in progress is waited for), not as the
    # claim read it: a register may wait for its turn long after its claim.
    if service.passport_status_locked(attempt.reg.passport_id) != Passport.Status.PUBLISHED:
        withdraw(attempt)
        return None
    return Request("register", attempt.reg)


def withdraw(attempt: Attempt) -> None:
    """The passport was withdrawn before this attempt asked the registry: this attempt sent
    nothing. On the row's first attempt nothing was ever sent and nothing is owed (suspended);
    after earlier attempts the registry may hold one of them, so the row owes a deactivation that
    first finds what it holds."""
    token, rows, now = attempt.token, attempt.rows, timezone.now()

    def after_withdrawn():
        DRAIN.on_commit()
        # Published again since the passport was read (the write waits for the pass's flush):
        # a row just suspended owes its registration again. (One now finding sees the publish
        # when the drain claims it, and registers afresh.)
        service.reregister_if_published(attempt.reg)

    attempt.finish(
        "register", "withdrawn", "passport no longer published; nothing sent",
        lambda: rows.mark_withdrawn(token=token, now=now) or rows.find_and_deactivate(token=token, now=now) == 1,
        on_taken=after_withdrawn,
    )  # fmt: skip


def settle_register(attempt: Attempt, reply: Reply) -> None:
    reg, token, rows = attempt.reg, attempt.token, attempt.rows
    if reply.failed(attempt, "register"):
        return
    answer = reply.answer
    if isinstance(answer, adapters.Accepted):
        attempt.finish(
            "register", "submitted", f"requestId {answer.request_id}",
            lambda: rows.mark_submitted(token=token, correlation_id=answer.request_id, next_check_at=next_check_at(1)),
            counts="submitted",
        )  # fmt: skip
    elif isinstance(answer, adapters.Duplicate):
        note = (
            f"the registry already held request {answer.request_id} for this UPI (DUPLICATE_UPI), "
            "most likely ours whose reply was lost; adopted it"
        )
        attempt.finish(
            "register", "duplicate", f"DUPLICATE_UPI requestId {answer.request_id}",
            lambda: rows.mark_submitted_noting(
                token=token, correlation_id=answer.request_id, note=note, next_check_at=next_check_at(1)
            ),
            counts="submitted",
        )  # fmt: skip
    elif isinstance(answer, NotAdopted):
        error = (
            f"{NOT_ADOPTED}the registry answered DUPLICATE_UPI naming request {answer.request_id}, whose "
            f"registration {answer.registration_id} it has deactivated: a deactivated registration is not "
            "held, so it is not this passport's. Ask the registry to let the UPI go (or to register it "
            "afresh); the drain keeps trying"
        )
        retry_at = timezone.now() + backoff_delay(reg.attempts)
        attempt.finish(
            "register", "not_adopted", error,
            lambda: rows.mark_attempt_failed(token=token, error=error, retry_at=retry_at),
            counts="failed",
        )  # fmt: skip
    else:
        attempt.finish(
            "register", "rejected", answer.errors,
            lambda: rows.mark_rejected(token=token, errors=answer.errors),
            event=registration_event(reg, "passport.registration_rejected", errors=answer.errors),
            counts="rejected",
        )  # fmt: skip


def plan_check(attempt: Attempt) -> Request:
    return Request("check", attempt.reg.correlation_id)


def settle_check(attempt: Attempt, reply: Reply) -> None:
    reg, token, rows = attempt.reg, attempt.token, attempt.rows
    if reply.failed(attempt, "check"):
        return
    answer = reply.answer
    if answer.status == "registered":

        def after_registered():
            # Suspended while the registry was checking: it now holds a registration it must drop.
            service.deactivate_if_suspended(reg)

        attempt.finish(
            "check", "registered", f"registrationId {answer.registration_id}",
            lambda: rows.mark_registered(token=token, handle=answer.registration_id),
            on_taken=after_registered, counts="registered",
            event=registration_event(reg, "passport.registered", registrationId=answer.registration_id),
        )  # fmt: skip
    elif answer.status == "rejected":
        attempt.finish(
            "check", "rejected", answer.errors,
            lambda: rows.mark_rejected(token=token, errors=answer.errors),
            event=registration_event(reg, "passport.registration_rejected", errors=answer.errors),
            counts="rejected",
        )  # fmt: skip
    else:
        attempt.finish(
            "check", "checking", "still checking",
            lambda: rows.mark_checked(token=token, next_check_at=next_check_at(reg.attempts + 1)),
        )  # fmt: skip


def plan_deactivate(attempt: Attempt) -> Request | None:
    reg, token, rows = attempt.reg, attempt.token, attempt.rows
    if service.passport_status_locked(reg.passport_id) == Passport.Status.PUBLISHED:
        # Published again since the deactivation was owed: nothing is sent. If this is its first
        # attempt the registry still holds the registration; if not, an earlier attempt may have
        # gone through with its reply lost, so it registers afresh; so does one still to find
        # what the registry holds (a register that may have landed is adopted as DUPLICATE_UPI).
        if reg.attempts == 1 and not reg.finds_first:
            attempt.finish(
                "deactivate", "cancelled", "passport published again; the registration stands",
                lambda: rows.cancel_deactivation(token=token) == 1,
            )  # fmt: skip
        else:
            attempt.finish(
                "deactivate", "reregister",
                "passport published again after a deactivation was attempted; registering afresh",
                lambda: rows.reregister(token=token, now=timezone.now()) == 1,
                on_taken=DRAIN.on_commit,
            )  # fmt: skip
        return None
    if reg.finds_first:
        return Request("find", reg)
    return Request("deactivate", reg.handle)


def settle_deactivate(attempt: Attempt, reply: Reply) -> None:
    reg, token, rows = attempt.reg, attempt.token, attempt.rows
    if reply.failed(attempt, "deactivate"):
        return

    def after_deactivated():
        # Published again while the registry was deactivating: it owes a registration afresh.
        service.reregister_if_published(reg)

    attempt.finish(
        "deactivate", "deactivated", reply.answer,
        lambda: rows.mark_deactivated(token=token),
        on_taken=after_deactivated, counts="deactivated",
        event=registration_event(reg, "passport.deregistered", registrationId=reg.handle),
    )  # fmt: skip


# -- a deactivation that first finds what the registry holds (a suspend after an attempted register) --


def settle_find(attempt: Attempt, reply: Reply) -> None:
    reg, token, rows = attempt.reg, attempt.token, attempt.rows
    if reply.failed(attempt, "find"):
        return
    finding, now = reply.answer, timezone.now()
    settles_at = reg.settles_at  # as the claim read it; the writes restate it
    if finding.held == "checking":
        attempt.finish(
            "find", "checking", finding.said,
            lambda: rows.mark_finding_waits(
                token=token, retry_at=next_check_at(reg.attempts + 1), correlation_id=finding.correlation_id,
                error=finding.said,
            ),
        )  # fmt: skip
    elif settles_at is not None:
        # A register of ours may still land: what the registry shows now is not all it will hold.
        said = f"{finding.said}; a register whose outcome is unknown may still land: looking again at {settles_at:%H:%M:%S}"
        attempt.finish(
            "find", "unsettled", said,
            lambda: rows.mark_finding_waits(token=token, retry_at=settles_at + timedelta(seconds=1), error=said),
        )  # fmt: skip
    elif finding.held == "deactivated":
        attempt.finish(
            "find", "deactivated", finding.said,
            lambda: rows.mark_found_deactivated(token=token, handle=finding.handle, now=now),
            on_taken=lambda: service.reregister_if_published(reg), counts="deactivated",
            event=registration_event(reg, "passport.deregistered", registrationId=finding.handle),
        )  # fmt: skip
    else:
        attempt.finish(
            "find", "absent", finding.said,
            lambda: rows.mark_found_absent(
                token=token, now=now, note=f"withdrawn: {finding.said} (suspended after an attempted register)"
            ),
            on_taken=lambda: service.reregister_if_published(reg),
        )  # fmt: skip


def settle_deactivation(attempt: Attempt, reply: Reply) -> None:
    if attempt.reg.finds_first:
        settle_find(attempt, reply)
    else:
        settle_deactivate(attempt, reply)


def operation_of(reg: Registration):
    """What a claimed row owes: (plan, settle)."""
    if reg.status == Registration.Status.SUBMITTED:
        return plan_check, settle_check
    if reg.operation == Registration.Operation.DEACTIVATE:
        return plan_deactivate, settle_deactivation
    return plan_register, settle_register


# An attempt on its own, start to end, on this thread (no pace): what tests of one write use.
def run_register(attempt: Attempt, adapter) -> None:
    if request := plan_register(attempt):
        settle_register(attempt, request.send(adapter))


def run_check(attempt: Attempt, adapter) -> None:
    settle_check(attempt, plan_check(attempt).send(adapter))


def run_deactivate(attempt: Attempt, adapter) -> None:
    if request := plan_deactivate(attempt):
        settle_deactivation(attempt, request.send(adapter))


# -- a pass -------------------------------------------------------------------------------------------


def longest_attempt_seconds(*, finds: bool = False) -> float:
    """The longest an attempt of the drain may take: one request (ODAL_REGISTRY_TIMEOUT_SECONDS),
    or, for a deactivation that first finds what the registry holds (registry.finding), the lookup
    of the task list (ODAL_REGISTRY_LOOKUP_SECONDS) then a check and a deactivation of the
    submission it finds (one each; a lookup that finds several makes as many more)."""
    timeout = settings.ODAL_REGISTRY_TIMEOUT_SECONDS
    return settings.ODAL_REGISTRY_LOOKUP_SECONDS + 2 * timeout if finds else timeout


# The request never went out (a pause came while it waited for its slot, the hold ran out, the
# process is stopping): the row is given back.
GIVEN_BACK = Reply()
# The register never went out: its passport was withdrawn while it waited for its slot.
WITHDRAWN = Reply()


def send_in_turn(request: Request, adapter, pace: Pace, slot: float, deadline: float) -> Reply:
    """On a pool thread: wait for the request's slot, then send it, unless its passport was
    withdrawn meanwhile, a 429 paused every drain, or the claim's hold has run out by the time
    this thread got to it (a pool thread may come free late: one still busy with a request of a
    pass that ended early). No database here."""
    while (delay := slot - time.monotonic()) > 0 and not (request.withdrawn.is_set() or stopping.requested()):
        request.withdrawn.wait(min(delay, PAUSE_REFRESH_SECONDS))  # (a stop is looked at as often)
    if request.withdrawn.is_set():
        return WITHDRAWN
    if pace.held_back() or time.monotonic() >= deadline or stopping.requested():
        return GIVEN_BACK
    return request.send(adapter)


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
                extra={"registration": attempt.reg.pk, "claim": attempt.token, "attempt": attempt.reg.attempts},
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
        attempt = Attempt(reg, self.claim.token, self.report, self.pending)
        plan, settle = operation_of(reg)
        request = self.guarded(attempt, plan)
        if request is not None:
            future = self.pool.submit(send_in_turn, request, self.adapter, self.pace, slot, until)
            self.track(future, reg, (attempt, settle, request))

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
            request.arg.passport_id: request
            for _, (_, _, request) in self.in_flight.values()
            if request.call == "register" and not request.sending
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

    def ended(self, reg, job, reply: "Reply") -> None:
        attempt, settle, _ = job
        if reply is GIVEN_BACK:
            self.not_started.append(reg.pk)
        elif reply is WITHDRAWN:
            self.guarded(attempt, withdraw)
        else:
            if isinstance(reply.error, adapters.RateLimited):
                self.pace.pause(reply.error.retry_after, str(reply.error))  # for every drain
            self.guarded(attempt, settle, reply)

    def take_waiting(self) -> list:
        waiting = [reg.pk for reg in self.waiting]
        self.waiting.clear()
        return waiting

    def write(self, endings: list) -> None:
        write_endings(endings)


@contextmanager
def drainer(adapter=None):
    """What a run of passes shares: the registry adapter (a run's own is closed with it), the
    pace (registry.pace) and the pool its requests go out on."""
    own = adapter is None
    adapter = adapter or adapters.get_adapter()
    try:
        with ThreadPoolExecutor(settings.ODAL_REGISTRY_CONCURRENCY, thread_name_prefix="odal-drain") as pool:
            yield {"adapter": adapter, "pace": Pace(), "pool": pool}
    finally:
        if own:
            adapter.close()


def drain_once(
    *, batch: int = 50, adapter=None, pace: Pace | None = None, pool: ThreadPoolExecutor | None = None
) -> DrainReport:
    """One pass: claim up to `batch` due registrations and do what each owes, up to
    ODAL_REGISTRY_CONCURRENCY requests at once. While the registry's pause holds (a 429), it
    claims nothing."""
    report = DrainReport(passes=1)
    if settings.ODAL_REGISTRY_ADAPTER == "none" and adapter is None:
        return report  # no registry queues on this node
    if pace is None or pool is None:  # a pass on its own
        with drainer(adapter) as shared:
            return drain_once(batch=batch, **shared)
    if pace.paused_for():
        return report
    claim = Registration.objects.claim(limit=batch, select_related=("passport",))
    report.claimed = len(claim.rows)
    if claim.rows:
        DrainPass(claim, report, adapter, pace, pool).run()
    tally.beat(tally.DRAIN)
    return report


class Drain(Work):
    """The drain's runs (odal.work.loops): each pass is drain_once, with the adapter, the pace and
    the pool a run shares. A run until idle waits for rows falling due within 10 s (a submitted
    row's next check, a short backoff), so a registration goes through in one run, and for a
    pause the registry asked for."""

    name, wake, Report, rows, batch = "registry drain", DRAIN, DrainReport, Registration.objects, 50
    linger_seconds = 10.0

    def tools(self):
        return drainer()

    def one_pass(self, *, batch: int, **shared) -> DrainReport:
        return drain_once(batch=batch, **shared)

    def paused_for(self, tools: dict) -> float:
        return tools["pace"].paused_for()

    def owed(self) -> bool:
        # The schedule's period: a row due later waits for it as well.
        return Registration.objects.due(database_now() + RELAY_HORIZON).exists()


RELAY_HORIZON = timedelta(seconds=60)  # a leading drain hands over while rows fall due this soon
DRAINING = Drain()
drain_until_idle, drain_listening, drain_forever = DRAINING.until_idle, DRAINING.listening, DRAINING.forever
