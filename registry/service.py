"""People's writes on registrations (abandon, record a handle), what publishing and suspending
owe the registry, and the counts. The API, the admin and the `odal` command all call these, so
they cannot disagree about what is refused and why."""

import time
from concurrent import futures
from dataclasses import dataclass
from enum import StrEnum

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from odal.core import tally
from odal.core.errors import Refused
from odal.core.models import AuditEntry, Passport
from odal.core.reasons import clean_reason
from odal.core.rows import insert_rows
from odal.core.text import unstorable
from odal.work.wake import DRAIN
from outbox.events import emit
from registry import adapters
from registry.models import UNSEARCHABLE, Registration

MAX_HANDLE_LENGTH = adapters.MAX_ID  # what the drain would take from the registry, and the column holds


def registration_for(dpp_id) -> Registration:
    reg = Registration.objects.select_related("passport").filter(passport_id=dpp_id).first()
    if reg is None:
        if not Passport.objects.filter(pk=dpp_id).exists():
            raise Refused(f"No passport {dpp_id}.", code="not_found", status=404)
        raise Refused(
            f"Passport {dpp_id} has no registration: it has never been published on this node.",
            code="no_registration",
            status=404,
        )
    return reg


# -- the lifecycle's side ---------------------------------------------------------------------------


class Owed(StrEnum):
    """What publishing or suspending did to the registration."""

    NOTHING = "nothing"  # no registry on this node, or no registration
    QUEUED = "queued"  # a registration or a deactivation queued (new or afresh)
    CANCELLED = "cancelled"  # an owed deactivation cancelled: the registration stands
    WITHDRAWN = "withdrawn"  # a register never sent, withdrawn
    LEFT = "left"  # left as it is, or to the drain


@dataclass(frozen=True)
class RegistryOutcome:
    """What publishing or suspending did to the registration, and the sentence that says so."""

    owed: Owed
    sentence: str

    def __str__(self) -> str:
        return self.sentence


NO_REGISTRY = RegistryOutcome(Owed.NOTHING, "no registry queues on this node")


def on_publish(passport: Passport) -> RegistryOutcome:
    """Publishing owes the registry a registration: a new row is pending and due now; a rejected,
    abandoned, suspended or deactivated one is queued afresh; a deactivation never attempted is
    cancelled, one attempted is followed by a fresh register; pending, submitted and registered
    rows (and a deactivation in flight, which the drain settles) are left alone. The caller holds
    the passport's row lock. Returns what it did."""
    if settings.ODAL_REGISTRY_ADAPTER == "none":
        return NO_REGISTRY
    now = timezone.now()
    reg, created = Registration.objects.get_or_create(passport=passport, defaults={"next_attempt_at": now})
    rows = Registration.objects.filter(pk=reg.pk)
    if created:
        outcome = RegistryOutcome(Owed.QUEUED, "registration queued")
    elif rows.requeue(now=now):
        outcome = RegistryOutcome(Owed.QUEUED, f"registration queued afresh (it was {reg.status})")
    elif rows.cancel_deactivation():
        outcome = RegistryOutcome(Owed.CANCELLED, "owed deactivation cancelled; the registration stands")
    elif rows.reregister(now=now):
        outcome = RegistryOutcome(
            Owed.QUEUED,
            "registration queued afresh (a deactivation had been attempted and may have gone through)",
        )
    else:
        return RegistryOutcome(Owed.LEFT, f"registration left as it is ({reg.status})")
    DRAIN.on_commit()
    return outcome


def on_publish_new(passport_ids: list) -> RegistryOutcome:
    """on_publish() for passports published in the transaction that created them (bulk intake,
    odal.surfaces.bulk): none can have a registration yet, so each gets a new one, pending and due now,
    all in one INSERT, and the drain is kicked once for them all. Returns what it did for each, in
    on_publish()'s words."""
    if settings.ODAL_REGISTRY_ADAPTER == "none":
        return NO_REGISTRY
    if passport_ids:
        now = timezone.now()
        insert_rows(
            Registration,
            [{"passport_id": pk} for pk in passport_ids],
            same={"next_attempt_at": now, "queued_at": now, "created_at": now},
        )
        DRAIN.on_commit()
    return RegistryOutcome(Owed.QUEUED, "registration queued")


def on_suspend(passport: Passport) -> RegistryOutcome:
    """Suspending never drops what the registry may hold. A pending register never attempted
    becomes suspended; one attempted (its request may have reached the registry, or still land)
    owes a deactivation that first finds what the registry holds; a registered one owes a
    deactivation. A row an attempt holds is left to the drain, which withdraws or finds it when
    it reports, and a row the registry is checking too: the drain queues the deactivation if the
    registry grants it. The caller holds the passport's row lock."""
    now = timezone.now()
    rows = Registration.objects.filter(passport=passport)
    if rows.withdraw_unsent(now=now):
        return RegistryOutcome(
            Owed.WITHDRAWN, "pending registration withdrawn (suspended): it was never sent to the registry"
        )
    if rows.find_and_deactivate(now=now):
        DRAIN.on_commit()
        return RegistryOutcome(
            Owed.QUEUED,
            "deactivation queued: the registration was attempted and the registry may hold it, so the "
            "drain finds what it holds and deactivates it (suspended once the registry provably holds nothing)",
        )
    if rows.queue_deactivation(now=now):
        DRAIN.on_commit()
        return RegistryOutcome(Owed.QUEUED, "deactivation queued")
    reg = rows.first()
    if reg is None:
        return RegistryOutcome(Owed.NOTHING, "no registration")
    if reg.status == Registration.Status.PENDING and reg.claim_token is not None:
        return RegistryOutcome(
            Owed.LEFT, f"registration left to the drain: an attempt holds it ({reg.operation})"
        )
    return RegistryOutcome(Owed.LEFT, f"registration left as it is ({reg.status})")


# -- abandon ---------------------------------------------------------------------------------------


@dataclass
class AbandonResult:
    registration: Registration
    already_abandoned: bool
    attempts: int
    detail: str


def check_abandonable(reg: Registration, now=None) -> None:
    """The 409s of the abandon table, decided from the row alone (the registry is not asked)."""
    now = now or timezone.now()
    if reg.status != Registration.Status.PENDING:
        raise Refused(
            f"The registration is {reg.status}: only a pending registration the registry never accepted "
            "can be abandoned.",
            code="not_pending",
        )
    if reg.operation != Registration.Operation.REGISTER:
        raise Refused(
            "The registration owes a deactivation, not a registration: the registry holds it, or may (a "
            "register was attempted before the passport was suspended), so it cannot be abandoned.",
            code="owes_deactivation",
        )
    if reg.attempts < 1:
        raise Refused(
            "The registration has never been attempted: wait for the first attempt to fail, then abandon it.",
            code="never_attempted",
        )
    if reg.claim_is_live(now):
        raise Refused(
            "An attempt is in flight right now: wait for it to report, then try again.",
            code="attempt_in_flight",
        )
    if reg.next_attempt_at <= now:
        raise Refused(
            "An attempt is due now: wait for the drain to make it (it may succeed), then try again.",
            code="due_now",
        )


def ask_registry(reg: Registration, adapter=None):
    """find_submission, with its answers that are not proof of absence turned into refusals.
    Returns None when the registry shows, exhaustively, that it holds nothing for the UPI."""
    if settings.ODAL_REGISTRY_ADAPTER == "none" and adapter is None:
        raise Refused(
            "This node has no registry queues (ODAL_REGISTRY_ADAPTER=none).", code="no_registry", status=501
        )
    own = adapter is None
    adapter = adapter or adapters.get_adapter()
    try:
        answer = adapter.find_submission(reg.passport.upi)
    except adapters.RegistryUnreadable as exc:
        raise Refused(
            f"The registry's task list could not be read ({exc}); nothing was changed. Safe to retry.",
            code="registry_unreadable",
            status=502,
            exit_code=3,
        ) from None
    except adapters.NoRegistry:
        raise Refused("This node has no registry queues.", code="no_registry", status=501) from None
    finally:
        if own:
            adapter.close()
    if isinstance(answer, adapters.Found):
        raise Refused(
            f"The registry holds a submission for this passport (correlation id {answer.correlation_id}); "
            "it may still be granted, so the registration cannot be abandoned.",
            code="registry_holds_submission",
            correlationId=answer.correlation_id,
        )
    if isinstance(answer, adapters.Ambiguous):
        raise Refused(
            f"The registry holds {len(answer.candidates)} submissions for this passport's UPI "
            f"({', '.join(answer.candidates)}); the registration cannot be abandoned.",
            code="registry_holds_submissions",
            candidates=answer.candidates,
        )
    if isinstance(answer, adapters.Unsupported):
        raise Refused(
            f"The registry cannot be searched ({answer.why}), so it cannot be shown not to hold this "
            "passport; nothing was changed.",
            code="registry_unsearchable",
            status=422,
        )
    if not answer.exhaustive:
        raise Refused(
            f"The registry could not be shown not to hold this passport ({answer.why}); nothing was changed. "
            "Try again later.",
            code="absence_not_proven",
            status=422,
        )
    refuse_unsettled(reg)
    return None


def refuse_unsettled(reg: Registration) -> None:
    """409 outcome_unknown while an attempt whose outcome is unknown is younger than
    ODAL_REGISTRY_SETTLE_SECONDS: its register may still land, so a task list that shows nothing
    proves nothing yet."""
    if (settles_at := reg.settles_at) is None:
        return
    ended = reg.last_unknown_at.isoformat(timespec="seconds")
    raise Refused(
        f"The registry's task list shows no submission for this passport, but an attempt whose outcome is "
        f"unknown ended at {ended} (its register may still reach the registry through a gateway or a queue), "
        f"so that is no proof yet; nothing was changed. Try again from {settles_at.isoformat(timespec='seconds')} "
        f"(ODAL_REGISTRY_SETTLE_SECONDS={settings.ODAL_REGISTRY_SETTLE_SECONDS}).",
        code="outcome_unknown",
        retryAfter=settles_at.isoformat(),
    )


def abandon(dpp_id, *, actor: str, reason, adapter=None) -> AbandonResult:
    """DESIGN.md's abandon table, in its order: 404, already abandoned (200, nothing asked or
    written), the 409s of the row, 422 reason, 501, then the registry (502/409/422), then the
    conditional update (409 if it takes nothing)."""
    reg = registration_for(dpp_id)
    if reg.status == Registration.Status.ABANDONED:
        return AbandonResult(reg, True, reg.attempts, "Already abandoned; nothing was asked or written.")
    check_abandonable(reg)
    reason = clean_reason(reason)
    ask_registry(reg, adapter)
    return finish_abandon(reg, actor=actor, reason=reason)


@dataclass(frozen=True)
class Lookup:
    """What the registry was found to hold for one registration within a lookup's deadline:
    `checked` False when the lookup did not finish in time (nothing is known, nothing may be
    written); else `refusal`, the Refused that the registry's answer makes (None: it provably
    holds nothing, the row can be abandoned)."""

    checked: bool
    refusal: Refused | None = None


NOT_CHECKED = Lookup(checked=False)


def ask_registry_within(regs: list[Registration], *, seconds: float, threads: int) -> dict:
    """ask_registry() for each of `regs` at once, on `threads` threads, all within `seconds` in
    total: each lookup's own deadline is what is left of it, and a lookup that has not finished by
    then (or not started) is NOT_CHECKED. The threads use no database: each registration (with its
    passport) was read before. Returns {registration pk: Lookup}."""
    deadline = time.monotonic() + seconds

    def lookup(reg: Registration) -> Lookup:
        left = deadline - time.monotonic()
        if left <= 0:
            return NOT_CHECKED
        adapter = None
        if settings.ODAL_REGISTRY_ADAPTER != "none":
            adapter = adapters.get_adapter(lookup_seconds=left)
        try:
            ask_registry(reg, adapter)
        except Refused as exc:
            if exc.code == "registry_unreadable" and time.monotonic() >= deadline - 0.05:
                return NOT_CHECKED  # cut short by the deadline: nothing is known
            return Lookup(checked=True, refusal=exc)
        finally:
            if adapter is not None:
                adapter.close()
        return Lookup(checked=True)

    pool = futures.ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="odal-abandon-lookup")
    try:
        asked = {pool.submit(lookup, reg): reg.pk for reg in regs}
        # Each lookup ends by the deadline (its requests are bounded by what is left); the margin
        # only covers a thread's last step after it.
        futures.wait(asked, timeout=max(0.0, deadline - time.monotonic()) + 1.0)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # never wait on a straggler past the deadline
    return {
        pk: (future.result() if future.done() and not future.cancelled() else NOT_CHECKED)
        for future, pk in asked.items()
    }


def finish_abandon(seen: Registration, *, actor: str, reason: str) -> AbandonResult:
    """The write that ends abandon, once the registry showed it holds nothing for the row `seen`
    (read before it was asked): the conditional update, its audit entry and event, or 409
    registration_changed and nothing written if the row is no longer what was seen."""
    reg = seen
    now = timezone.now()
    with transaction.atomic():
        if not Registration.objects.filter(pk=reg.pk).abandon(actor=actor, reason=reason, now=now, seen=reg):
            # A late attempt whose outcome is unknown may have been noted meanwhile.
            refuse_unsettled(Registration.objects.get(pk=reg.pk))
            raise Refused(
                "The registration changed while the registry was asked (an attempt was made meanwhile, and "
                "its request may have reached the registry after the lookup read past it); nothing was "
                "written. Look again and retry.",
                code="registration_changed",
            )
        AuditEntry.objects.record(
            actor=actor,
            action="registry_abandoned",
            obj=reg,
            reason=reason,
            details={
                "dppId": str(reg.passport_id),
                "upi": reg.passport.upi,
                "attempts": reg.attempts,
                "lastError": reg.last_error,
            },
        )
        emit("passport.registration_abandoned", {"dppId": str(reg.passport_id), "upi": reg.passport.upi})
    reg.refresh_from_db()
    return AbandonResult(
        reg,
        False,
        reg.attempts,
        "Abandoned: the registry holds no submission for this passport. The passport stays "
        f"{reg.passport.status}; publishing it again queues a fresh registration.",
    )


# -- record a handle -------------------------------------------------------------------------------


def clean_handle(value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise Refused(
            "A handle (the registry's registrationId) is required.", code="invalid_handle", status=422
        )
    handle = value.strip()
    if (
        len(handle) > MAX_HANDLE_LENGTH
        or any(ord(ch) < 32 or ord(ch) == 127 or ch.isspace() for ch in handle)
        or unstorable(handle)  # (a lone surrogate: a byte not UTF-8 on a command line)
    ):
        raise Refused(
            f"A handle is at most {MAX_HANDLE_LENGTH} printable characters without spaces.",
            code="invalid_handle",
            status=422,
        )
    return handle


def record_handle(dpp_id, *, handle, actor: str, reason) -> Registration:
    """A person read the registry's handle for the registration off its portal: a submitted row
    becomes registered; a deactivation whose finding cannot search the registry is deactivated by
    the drain by that handle (record_finding_handle)."""
    reg = registration_for(dpp_id)
    if reg.status == Registration.Status.ABANDONED:
        raise Refused(
            "The registration was abandoned: the registry never accepted it, so it has no handle to record. "
            "Publish the passport again to queue a fresh registration.",
            code="registration_abandoned",
        )
    if reg.status == Registration.Status.PENDING and reg.finds_first:
        return record_finding_handle(reg, handle=handle, actor=actor, reason=reason)
    if reg.status != Registration.Status.SUBMITTED:
        raise Refused(
            f"The registration is {reg.status}{' (it owes a deactivation)' if reg.operation == 'deactivate' else ''}: "
            "a handle can only be recorded while the registry is checking a submission (submitted), or for a "
            "deactivation whose finding cannot search the registry.",
            code="not_submitted",
        )
    handle = clean_handle(handle)
    reason = clean_reason(reason)
    with transaction.atomic():
        if not Registration.objects.filter(pk=reg.pk).record_handle(
            handle=handle, actor=actor, reason=reason, now=timezone.now(), seen=reg
        ):
            raise Refused(
                "The registration changed meanwhile (the drain checked or settled it); nothing was written. "
                "Look again and retry.",
                code="registration_changed",
            )
        AuditEntry.objects.record(
            actor=actor,
            action="registry_handle_recorded",
            obj=reg,
            reason=reason,
            details={"dppId": str(reg.passport_id), "handle": handle, "correlationId": reg.correlation_id},
        )
        emit(
            "passport.registered",
            {"dppId": str(reg.passport_id), "upi": reg.passport.upi, "registrationId": handle},
        )
        deactivate_if_suspended(reg)
    reg.refresh_from_db()
    return reg


def record_finding_handle(reg: Registration, *, handle, actor: str, reason) -> Registration:
    """Record handle on a deactivation that first finds what the registry holds (a suspend after an
    attempted register) and whose finding cannot search the registry: the person found the
    registration in the registry's own portal, so the drain deactivates it by that handle, due
    now. Refused (nothing written) while an attempt holds the row, while its finding has not
    found the registry unsearchable, and while a register of ours may still land."""
    if reg.claim_token is not None:
        raise Refused(
            "An attempt holds the registration right now (its deactivation is looking for what the registry "
            "holds): wait for it to report, then try again.",
            code="attempt_in_flight",
        )
    if not reg.last_error.startswith(UNSEARCHABLE):
        said = f" (its last attempt: {reg.last_error})" if reg.last_error else ""
        raise Refused(
            "The registration's deactivation is still finding what the registry holds: the drain can search "
            f"the registry{said}. A handle can be recorded on it only once its finding cannot search the "
            "registry.",
            code="registry_searchable",
        )
    handle = clean_handle(handle)
    reason = clean_reason(reason)
    with transaction.atomic():
        if not Registration.objects.filter(pk=reg.pk).record_finding_handle(
            handle=handle, actor=actor, reason=reason, now=timezone.now(), seen=reg
        ):
            refuse_unsettled_handle(Registration.objects.get(pk=reg.pk))  # the write restates the window
            raise Refused(
                "The registration changed meanwhile (the drain tried its deactivation again); nothing was "
                "written. Look again and retry.",
                code="registration_changed",
            )
        AuditEntry.objects.record(
            actor=actor,
            action="registry_handle_recorded",
            obj=reg,
            reason=reason,
            details={
                "dppId": str(reg.passport_id),
                "handle": handle,
                "operation": Registration.Operation.DEACTIVATE,
                "lastError": reg.last_error,
            },
        )
        DRAIN.on_commit()
    reg.refresh_from_db()
    return reg


def refuse_unsettled_handle(reg: Registration) -> None:
    """409 outcome_unknown while a register of ours may still land (as refuse_unsettled, for a
    handle read off the registry's portal: the portal does not show yet all the registry will hold)."""
    if (settles_at := reg.settles_at) is None:
        return
    raise Refused(
        f"An attempt whose outcome is unknown ended at {reg.last_unknown_at.isoformat(timespec='seconds')}: "
        "its register may still reach the registry, so what its portal shows is not yet all it will hold; "
        f"nothing was changed. Try again from {settles_at.isoformat(timespec='seconds')} "
        f"(ODAL_REGISTRY_SETTLE_SECONDS={settings.ODAL_REGISTRY_SETTLE_SECONDS}).",
        code="outcome_unknown",
        retryAfter=settles_at.isoformat(),
    )


def passport_status_locked(dpp_id) -> str | None:
    """The passport's status as committed once its row lock is ours: a publish or suspend in
    progress is waited for, not read past. (The lock is taken on the primary key alone: a status
    filter would skip a row whose new status is not yet committed, without waiting.) Holds the
    lock to the end of the caller's transaction, or of this read outside one."""
    with transaction.atomic():
        return Passport.objects.select_for_update().filter(pk=dpp_id).values_list("status", flat=True).first()


def deactivate_if_suspended(reg: Registration) -> bool:
    """A registration just became registered: if its passport was suspended meanwhile, the
    registry now holds one it must drop. The passport's row is locked, so a suspend committing at
    this moment is seen (it waits for us, or we for it). Call inside the write's transaction."""
    if passport_status_locked(reg.passport_id) != Passport.Status.SUSPENDED:
        return False
    if Registration.objects.filter(pk=reg.pk).queue_deactivation(now=timezone.now()):
        DRAIN.on_commit()
        return True
    return False


def reregister_if_published(reg: Registration) -> bool:
    """A registration was just deactivated: if its passport was published again meanwhile, it
    owes a registration afresh. Locks the passport's row as deactivate_if_suspended does."""
    if passport_status_locked(reg.passport_id) != Passport.Status.PUBLISHED:
        return False
    if Registration.objects.filter(pk=reg.pk).requeue(now=timezone.now()):
        DRAIN.on_commit()
        return True
    return False


# -- counts ----------------------------------------------------------------------------------------


def registry_counts() -> dict:
    """Registrations per status, from the tally their writes keep (odal.core.tally: the same cost at
    any size), and the stalled ones (pending, so a small set) counted from the rows."""
    counts = dict.fromkeys(Registration.Status.values, 0)
    for status, n in tally.totals("registry.status")["registry.status"].items():
        if status in counts:
            counts[status] = n
    counts["stalled"] = Registration.objects.stalled().count()
    return counts
