"""What each registry operation owes: planned before its call goes out (the call, or an
ending with none), settled from what the call got (an ending: registry.settling)."""

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from odal.core.models import Passport
from odal.work.claims import backoff_delay
from odal.work.wake import DRAIN
from registry import adapters, service
from registry.calls import Ask, CallResult, NotAdopted, RegistryCall
from registry.models import NOT_ADOPTED, Registration, RegistrationAttempt
from registry.settling import Attempt

Outcome = RegistrationAttempt.Outcome


def next_check_at(attempt: int):
    return timezone.now() + backoff_delay(
        attempt, base_seconds=settings.ODAL_REGISTRY_CHECK_SECONDS, cap_seconds=3600
    )


def registration_event(reg: Registration, event_type: str, **extra) -> tuple[str, dict]:
    """An event about a registration, to emit if its write takes the row."""
    return event_type, {"dppId": str(reg.passport_id), "upi": reg.passport.upi, **extra}


def plan_register(attempt: Attempt) -> RegistryCall | None:
    # The passport's status as committed now (a suspend in progress is waited for), not as the
    # claim read it: a register may wait for its turn long after its claim.
    if service.passport_status_locked(attempt.reg.passport_id) != Passport.Status.PUBLISHED:
        withdraw(attempt)
        return None
    return RegistryCall(Ask.REGISTER, attempt.reg)


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
        "register", Outcome.WITHDRAWN, "passport no longer published; nothing sent",
        lambda: rows.mark_withdrawn(token=token, now=now) or rows.find_and_deactivate(token=token, now=now) == 1,
        on_taken=after_withdrawn,
    )  # fmt: skip


def settle_register(attempt: Attempt, result: CallResult) -> None:
    reg, token, rows = attempt.reg, attempt.token, attempt.rows
    if result.failed(attempt, "register"):
        return
    answer = result.answer
    if isinstance(answer, adapters.Accepted):
        attempt.finish(
            "register", Outcome.SUBMITTED, f"requestId {answer.request_id}",
            lambda: rows.mark_submitted(token=token, correlation_id=answer.request_id, next_check_at=next_check_at(1)),
            counts="submitted",
        )  # fmt: skip
    elif isinstance(answer, adapters.Duplicate):
        note = (
            f"the registry already held request {answer.request_id} for this UPI (DUPLICATE_UPI), "
            "most likely ours whose reply was lost; adopted it"
        )
        attempt.finish(
            "register", Outcome.DUPLICATE, f"DUPLICATE_UPI requestId {answer.request_id}",
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
            "register", Outcome.NOT_ADOPTED, error,
            lambda: rows.mark_attempt_failed(token=token, error=error, retry_at=retry_at),
            counts="failed",
        )  # fmt: skip
    else:
        rejected(attempt, "register", answer.errors)


def rejected(attempt: Attempt, operation: str, errors: str) -> None:
    """The registry rejected the passport (a register's answer, or a check's)."""
    attempt.finish(
        operation, Outcome.REJECTED, errors,
        lambda: attempt.rows.mark_rejected(token=attempt.token, errors=errors),
        event=registration_event(attempt.reg, "passport.registration_rejected", errors=errors),
        counts="rejected",
    )  # fmt: skip


def plan_check(attempt: Attempt) -> RegistryCall:
    return RegistryCall(Ask.CHECK, attempt.reg.correlation_id)


def settle_check(attempt: Attempt, result: CallResult) -> None:
    reg, token, rows = attempt.reg, attempt.token, attempt.rows
    if result.failed(attempt, "check"):
        return
    answer = result.answer
    if answer.status == "registered":

        def after_registered():
            # Suspended while the registry was checking: it now holds a registration it must drop.
            service.deactivate_if_suspended(reg)

        attempt.finish(
            "check", Outcome.REGISTERED, f"registrationId {answer.registration_id}",
            lambda: rows.mark_registered(token=token, handle=answer.registration_id),
            on_taken=after_registered, counts="registered",
            event=registration_event(reg, "passport.registered", registrationId=answer.registration_id),
        )  # fmt: skip
    elif answer.status == "rejected":
        rejected(attempt, "check", answer.errors)
    else:
        attempt.finish(
            "check", Outcome.CHECKING, "still checking",
            lambda: rows.mark_checked(token=token, next_check_at=next_check_at(reg.attempts + 1)),
        )  # fmt: skip


def plan_deactivate(attempt: Attempt) -> RegistryCall | None:
    reg, token, rows = attempt.reg, attempt.token, attempt.rows
    if service.passport_status_locked(reg.passport_id) == Passport.Status.PUBLISHED:
        # Published again since the deactivation was owed: nothing is sent. If this is its first
        # attempt the registry still holds the registration; if not, an earlier attempt may have
        # gone through with its reply lost, so it registers afresh; so does one still to find
        # what the registry holds (a register that may have landed is adopted as DUPLICATE_UPI).
        if reg.attempts == 1 and not reg.finds_first:
            attempt.finish(
                "deactivate", Outcome.CANCELLED, "passport published again; the registration stands",
                lambda: rows.cancel_deactivation(token=token) == 1,
            )  # fmt: skip
        else:
            attempt.finish(
                "deactivate", Outcome.REREGISTER,
                "passport published again after a deactivation was attempted; registering afresh",
                lambda: rows.reregister(token=token, now=timezone.now()) == 1,
                on_taken=DRAIN.on_commit,
            )  # fmt: skip
        return None
    if reg.finds_first:
        return RegistryCall(Ask.FIND, reg)
    return RegistryCall(Ask.DEACTIVATE, reg.handle)


def settle_deactivate(attempt: Attempt, result: CallResult) -> None:
    reg, token, rows = attempt.reg, attempt.token, attempt.rows
    if result.failed(attempt, "deactivate"):
        return

    def after_deactivated():
        # Published again while the registry was deactivating: it owes a registration afresh.
        service.reregister_if_published(reg)

    attempt.finish(
        "deactivate", Outcome.DEACTIVATED, result.answer,
        lambda: rows.mark_deactivated(token=token),
        on_taken=after_deactivated, counts="deactivated",
        event=registration_event(reg, "passport.deregistered", registrationId=reg.handle),
    )  # fmt: skip


# -- a deactivation that first finds what the registry holds (a suspend after an attempted register) --


def settle_find(attempt: Attempt, result: CallResult) -> None:
    reg, token, rows = attempt.reg, attempt.token, attempt.rows
    if result.failed(attempt, "find"):
        return
    finding, now = result.answer, timezone.now()
    settles_at = reg.settles_at  # as the claim read it; the writes restate it
    if finding.held == "checking":
        attempt.finish(
            "find", Outcome.CHECKING, finding.said,
            lambda: rows.mark_finding_waits(
                token=token, retry_at=next_check_at(reg.attempts + 1), correlation_id=finding.correlation_id,
                error=finding.said,
            ),
        )  # fmt: skip
    elif settles_at is not None:
        # A register of ours may still land: what the registry shows now is not all it will hold.
        said = f"{finding.said}; a register whose outcome is unknown may still land: looking again at {settles_at:%H:%M:%S}"
        attempt.finish(
            "find", Outcome.UNSETTLED, said,
            lambda: rows.mark_finding_waits(token=token, retry_at=settles_at + timedelta(seconds=1), error=said),
        )  # fmt: skip
    elif finding.held == "deactivated":
        attempt.finish(
            "find", Outcome.DEACTIVATED, finding.said,
            lambda: rows.mark_found_deactivated(token=token, handle=finding.handle, now=now),
            on_taken=lambda: service.reregister_if_published(reg), counts="deactivated",
            event=registration_event(reg, "passport.deregistered", registrationId=finding.handle),
        )  # fmt: skip
    else:
        attempt.finish(
            "find", Outcome.ABSENT, finding.said,
            lambda: rows.mark_found_absent(
                token=token, now=now, note=f"withdrawn: {finding.said} (suspended after an attempted register)"
            ),
            on_taken=lambda: service.reregister_if_published(reg),
        )  # fmt: skip


def settle_deactivation(attempt: Attempt, result: CallResult) -> None:
    if attempt.reg.finds_first:
        settle_find(attempt, result)
    else:
        settle_deactivate(attempt, result)


def operation_of(reg: Registration):
    """What a claimed row owes: (plan, settle)."""
    if reg.status == Registration.Status.SUBMITTED:
        return plan_check, settle_check
    if reg.operation == Registration.Operation.DEACTIVATE:
        return plan_deactivate, settle_deactivation
    return plan_register, settle_register
