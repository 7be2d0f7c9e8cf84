"""The registry drain: claim due registrations (the outbox's claim mechanism), ask the registry,
and end each attempt with a guarded write and a line in the attempt log.

Due pending rows register (or deactivate); due submitted rows are checked. Every write is
guarded by the drain's claim and the status it expects, so nothing the drain writes can touch a
row that a person abandoned, or that another attempt settled, while it was asking.
"""

import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, transaction
from django.utils import timezone

from odal import reconnect, tally
from odal.models import Passport
from odal.text import error_text, storable
from outbox.claims import backoff_delay
from outbox.events import emit
from registry import adapters, service
from registry.models import Registration, RegistrationAttempt, RegistrationQuerySet

log = logging.getLogger(__name__)


@dataclass
class DrainReport:
    claimed: int = 0
    submitted: int = 0
    registered: int = 0
    rejected: int = 0
    deactivated: int = 0
    failed: int = 0
    late: int = 0
    write_errors: int = 0  # outcomes the database refused (each in the attempt log)
    not_started: int = 0  # claimed, but the hold ran out before their turn (attempt given back)
    passes: int = 0

    def add(self, other: "DrainReport") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def summary(self) -> str:
        text = (
            f"{self.claimed} claimed, {self.submitted} submitted, {self.registered} registered, "
            f"{self.rejected} rejected, {self.deactivated} deactivated, {self.failed} failed, {self.late} late"
        )
        if self.write_errors:
            text += f", {self.write_errors} not written (database refused)"
        if self.not_started:
            text += f", {self.not_started} not started (hold ran out)"
        return text


def next_check_at(attempt: int):
    return timezone.now() + backoff_delay(
        attempt, base_seconds=settings.ODAL_REGISTRY_CHECK_SECONDS, cap_seconds=3600
    )


def registration_event(reg: Registration, event_type: str, **extra) -> None:
    emit(event_type, {"dppId": str(reg.passport_id), "upi": reg.passport.upi, **extra})


class Attempt:
    """One claimed row's attempt: ask, then write the outcome and its log line together."""

    def __init__(self, reg: Registration, token, report: DrainReport):
        self.reg, self.token, self.report = reg, token, report
        self.started_at = timezone.now()
        self.rows = Registration.objects.filter(pk=reg.pk)

    def finish(self, operation: str, outcome: str, answer: str, write, on_taken=None) -> bool:
        """Write the outcome and its log line in one transaction. If the database refuses them,
        the row keeps its claim until the hold runs out (then it is due again) and the log gets
        a write_error line instead: one row the database cannot store never ends the drain. If the
        database is lost meanwhile, DatabaseLost unwinds the pass: nothing more is written for
        this claim, and the row is due again after the hold (odal.reconnect)."""
        try:
            with transaction.atomic():
                took = write()
                self.log(operation, outcome, answer, late=not took)
                if took and on_taken:
                    on_taken()
        except Exception as exc:
            reconnect.raise_if_lost(exc)
            self.write_error(operation, outcome, answer, exc)
            return False
        if not took:
            self.report.late += 1
            log.warning(
                "late %s answer (%s) for registration %s attempt %s (claim %s): its claim was superseded "
                "or the row settled; nothing written",
                operation,
                outcome,
                self.reg.pk,
                self.reg.attempts,
                self.token,
                extra={"registration": self.reg.pk, "claim": self.token, "attempt": self.reg.attempts},
            )
        return took

    def log(self, operation: str, outcome: str, answer: str, *, late: bool) -> None:
        RegistrationAttempt.objects.create(
            registration_id=self.reg.pk,
            number=self.reg.attempts,
            claim_token=self.token,
            operation=operation,
            started_at=self.started_at,
            finished_at=timezone.now(),
            outcome=outcome,
            answer=storable(answer),
            late=late,
        )

    def write_error(self, operation: str, outcome: str, answer: str, exc: Exception) -> None:
        """The database refused this outcome: a write_error line in the attempt log (counted as
        registry_write_errors_total) and the process log say so."""
        self.report.write_errors += 1
        error = f"the registry answered {outcome} ({answer}), but it could not be written: {error_text(exc)}"
        ids = {"registration": self.reg.pk, "claim": self.token, "attempt": self.reg.attempts}
        log.error("registration %s %s: %s", self.reg.pk, operation, storable(error), extra=ids)
        try:
            with transaction.atomic():
                self.log(operation, RegistrationAttempt.WRITE_ERROR, error, late=False)
        except Exception as exc:
            reconnect.raise_if_lost(exc)
            log.exception(
                "registration %s: not even the attempt-log line could be written", self.reg.pk, extra=ids
            )

    def failed(self, operation: str, error: str) -> None:
        # Every failed attempt, taken or late (a late one gets a line of its own from finish).
        log.warning(
            "registration %s %s attempt %s (claim %s) failed: %s",
            self.reg.pk, operation, self.reg.attempts, self.token, storable(error, 200),
            extra={"registration": self.reg.pk, "claim": self.token, "attempt": self.reg.attempts},
        )  # fmt: skip
        retry_at = timezone.now() + backoff_delay(self.reg.attempts)
        if self.finish(
            operation, "failed", error,
            lambda: self.rows.mark_attempt_failed(token=self.token, error=error, retry_at=retry_at),
        ):  # fmt: skip
            self.report.failed += 1


def run_register(attempt: Attempt, adapter) -> None:
    reg, token, rows = attempt.reg, attempt.token, attempt.rows
    if reg.passport.status != Passport.Status.PUBLISHED:
        # Withdrawn before this attempt asked the registry: nothing was sent, nothing is owed.
        attempt.finish(
            "register", "withdrawn", "passport no longer published", lambda: rows.mark_withdrawn(token=token)
        )
        return
    try:
        answer = adapter.register(reg)
    except adapters.Retryable as exc:
        attempt.failed("register", storable(exc))
        return
    if isinstance(answer, adapters.Accepted):
        if attempt.finish(
            "register", "submitted", f"requestId {answer.request_id}",
            lambda: rows.mark_submitted(token=token, correlation_id=answer.request_id, next_check_at=next_check_at(1)),
        ):  # fmt: skip
            attempt.report.submitted += 1
    elif isinstance(answer, adapters.Duplicate):
        note = (
            f"the registry already held request {answer.request_id} for this UPI (DUPLICATE_UPI), "
            "most likely ours whose reply was lost; adopted it"
        )
        if attempt.finish(
            "register", "duplicate", f"DUPLICATE_UPI requestId {answer.request_id}",
            lambda: rows.mark_submitted_noting(
                token=token, correlation_id=answer.request_id, note=note, next_check_at=next_check_at(1)
            ),
        ):  # fmt: skip
            attempt.report.submitted += 1
    else:
        if attempt.finish(
            "register", "rejected", answer.errors,
            lambda: rows.mark_rejected(token=token, errors=answer.errors),
            on_taken=lambda: registration_event(reg, "passport.registration_rejected", errors=answer.errors),
        ):  # fmt: skip
            attempt.report.rejected += 1


def run_check(attempt: Attempt, adapter) -> None:
    reg, token, rows = attempt.reg, attempt.token, attempt.rows
    try:
        answer = adapter.check(reg.correlation_id)
    except adapters.Retryable as exc:
        attempt.failed("check", storable(exc))
        return
    if answer.status == "registered":

        def after_registered():
            registration_event(reg, "passport.registered", registrationId=answer.registration_id)
            # Suspended while the registry was checking: it now holds a registration it must drop.
            service.deactivate_if_suspended(reg)

        if attempt.finish(
            "check", "registered", f"registrationId {answer.registration_id}",
            lambda: rows.mark_registered(token=token, handle=answer.registration_id),
            on_taken=after_registered,
        ):  # fmt: skip
            attempt.report.registered += 1
    elif answer.status == "rejected":
        if attempt.finish(
            "check", "rejected", answer.errors,
            lambda: rows.mark_rejected(token=token, errors=answer.errors),
            on_taken=lambda: registration_event(reg, "passport.registration_rejected", errors=answer.errors),
        ):  # fmt: skip
            attempt.report.rejected += 1
    else:
        attempt.finish(
            "check", "checking", "still checking",
            lambda: rows.mark_checked(token=token, next_check_at=next_check_at(reg.attempts + 1)),
        )  # fmt: skip


def run_deactivate(attempt: Attempt, adapter) -> None:
    reg, token, rows = attempt.reg, attempt.token, attempt.rows
    if service.passport_status_locked(reg.passport_id) == Passport.Status.PUBLISHED:
        # Published again since the deactivation was owed: nothing is sent. If this is its first
        # attempt the registry still holds the registration; if not, an earlier attempt may have
        # gone through with its reply lost, so it registers afresh.
        if reg.attempts == 1:
            attempt.finish(
                "deactivate", "cancelled", "passport published again; the registration stands",
                lambda: rows.cancel_deactivation(token=token) == 1,
            )  # fmt: skip
        else:
            attempt.finish(
                "deactivate", "reregister",
                "passport published again after a deactivation was attempted; registering afresh",
                lambda: rows.reregister(token=token, now=timezone.now()) == 1,
                on_taken=service.kick_drain_on_commit,
            )  # fmt: skip
        return
    try:
        outcome = adapter.deactivate(reg.handle)
    except adapters.Retryable as exc:
        attempt.failed("deactivate", storable(exc))
        return

    def after_deactivated():
        registration_event(reg, "passport.deregistered", registrationId=reg.handle)
        # Published again while the registry was deactivating: it owes a registration afresh.
        service.reregister_if_published(reg)

    if attempt.finish(
        "deactivate", "deactivated", outcome,
        lambda: rows.mark_deactivated(token=token),
        on_taken=after_deactivated,
    ):  # fmt: skip
        attempt.report.deactivated += 1


def drain_once(*, batch: int = 50, adapter=None) -> DrainReport:
    """One pass: claim up to `batch` due registrations and do what each owes."""
    report = DrainReport(passes=1)
    if settings.ODAL_REGISTRY_ADAPTER == "none" and adapter is None:
        return report  # no registry queues on this node
    claim = Registration.objects.claim(limit=batch, select_related=("passport",))
    report.claimed = len(claim.rows)
    if not claim.rows:
        tally.beat(tally.DRAIN)
        return report
    own = adapter is None
    adapter = adapter or adapters.get_adapter()
    started = 0
    try:
        for reg in claim.rows:
            if not claim.holds():
                # The hold ran out: these rows are due again and may be another drain's already.
                # No request goes out for them from here; they get their counted attempt back.
                break
            started += 1
            attempt = Attempt(reg, claim.token, report)
            try:
                if reg.status == Registration.Status.SUBMITTED:
                    run_check(attempt, adapter)
                elif reg.operation == Registration.Operation.DEACTIVATE:
                    run_deactivate(attempt, adapter)
                else:
                    run_register(attempt, adapter)
            except Exception as exc:  # a bug of ours fails the attempt, not the drain
                log.exception(
                    "registration %s: attempt raised", reg.pk,
                    extra={"registration": reg.pk, "claim": claim.token, "attempt": reg.attempts},
                )  # fmt: skip
                attempt.failed(reg.operation, error_text(exc))
    finally:
        if own:
            adapter.close()
        if started < len(claim.rows):
            report.not_started += len(claim.rows) - started
            given_back = Registration.objects.filter(pk__in=[r.pk for r in claim.rows[started:]])
            given_back.release(token=claim.token)
            log.warning(
                "%s claimed registrations not started: the claim's hold ran out first", report.not_started
            )
    tally.beat(tally.DRAIN)
    return report


def drain_until_idle(
    *, batch: int = 50, max_seconds: float = 50.0, linger_seconds: float = 10.0
) -> DrainReport:
    """Passes until nothing is due. Rows falling due within `linger_seconds` (a submitted row's
    next check, a short backoff) are waited for, so a registration goes through in one run. A
    database lost meanwhile is waited for until `max_seconds` (odal.reconnect); past it, its
    error is raised."""
    report = DrainReport()
    deadline = time.monotonic() + max_seconds
    outage = reconnect.Outage("registry drain", deadline=deadline)
    while True:
        try:
            one = drain_once(batch=batch)
        except reconnect.ERRORS as exc:
            if not reconnect.is_lost(exc):
                raise
            if not outage.wait(exc):
                raise reconnect.database_error(exc) from None
            continue
        report.add(one)
        if time.monotonic() >= deadline:
            return report
        if one.claimed:
            continue
        now = timezone.now()
        upcoming = (
            Registration.objects.filter(status__in=RegistrationQuerySet.claimable_statuses)
            .filter(next_attempt_at__gt=now, next_attempt_at__lte=now + timedelta(seconds=linger_seconds))
            .order_by("next_attempt_at")
            .values_list("next_attempt_at", flat=True)
            .first()
        )
        if upcoming is None:
            return report
        time.sleep(min(max(0.05, (upcoming - now).total_seconds()), max(0.0, deadline - time.monotonic())))


def drain_forever(*, batch: int = 50, idle_sleep: float = 1.0, should_stop=lambda: False) -> DrainReport:
    """What `odal registry drain` runs: passes until told to stop, resting `idle_sleep` when
    nothing is due. A lost database is waited for, however long, and the passes go on."""
    report = DrainReport()
    outage = reconnect.Outage("registry drain", should_stop=should_stop)
    while not should_stop():
        try:
            close_old_connections()
            one = drain_once(batch=batch)
        except reconnect.ERRORS as exc:
            if not reconnect.is_lost(exc):
                raise
            if not outage.wait(exc):
                break
            continue
        report.add(one)
        if one.claimed == 0 and not should_stop():
            time.sleep(idle_sleep)
    return report
