"""The passport lifecycle: publish and suspend.

Each is one transaction: the passport's guarded status update, its audit entry, the event it
emits and the registry work it queues commit together or not at all.
"""

from dataclasses import dataclass

from django.db import transaction

from odal.core.errors import Refused
from odal.core.models import AuditEntry, Passport
from outbox.events import emit
from registry import service as registry


@dataclass
class LifecycleResult:
    passport: Passport
    changed: bool
    detail: str


def _lock(dpp_id) -> None:
    """Take the passport's row lock for the rest of the transaction: transitions of one passport
    (and the drain's checks of its status) happen one after another, so each answer says what
    that transition did and the registry work always follows the final status."""
    if not Passport.objects.select_for_update().filter(pk=dpp_id).exists():
        raise Refused(f"No passport {dpp_id}.", code="not_found", status=404)


def _get(dpp_id) -> Passport:
    return Passport.objects.get(pk=dpp_id)


def passport_event(passport: Passport) -> dict:
    return {
        "dppId": str(passport.pk),
        "upi": passport.upi,
        "operatorId": passport.operator_id,
        "status": passport.status,
    }


def publish(dpp_id, *, actor: str, reason: str = "") -> LifecycleResult:
    """Draft or suspended -> published, and the registry is owed a registration. Publishing a
    published passport changes its status not, but queues afresh a registration that was
    rejected or abandoned."""
    with transaction.atomic():
        _lock(dpp_id)
        took = Passport.objects.filter(pk=dpp_id).mark_published() == 1
        passport = _get(dpp_id)
        if (
            passport.status != Passport.Status.PUBLISHED
        ):  # pragma: no cover - mark_published covers all others
            raise Refused(
                f"The passport is {passport.status} and cannot be published.", code="not_publishable"
            )
        registry_outcome = registry.on_publish(passport)
        requeued = registry_outcome.owed in (registry.Owed.QUEUED, registry.Owed.CANCELLED)
        if took:
            AuditEntry.objects.record(
                actor=actor, action="passport_published", obj=passport, reason=reason,
                details={"registry": registry_outcome.sentence},
            )  # fmt: skip
            emit("passport.published", passport_event(passport))
            detail = f"Published; {registry_outcome.sentence}."
        elif requeued:
            AuditEntry.objects.record(
                actor=actor, action="registry_requeued", obj=passport, reason=reason,
                details={"registry": registry_outcome.sentence},
            )  # fmt: skip
            detail = f"The passport was already published; {registry_outcome.sentence}."
        else:
            detail = f"The passport was already published; nothing changed ({registry_outcome.sentence})."
    return LifecycleResult(passport, took or requeued, detail)


def suspend(dpp_id, *, actor: str, reason: str = "") -> LifecycleResult:
    """Published -> suspended (withdrawn); the registry work follows (see registry.service)."""
    with transaction.atomic():
        _lock(dpp_id)
        took = Passport.objects.filter(pk=dpp_id).mark_suspended() == 1
        passport = _get(dpp_id)
        if took:
            registry_outcome = registry.on_suspend(passport)
            AuditEntry.objects.record(
                actor=actor, action="passport_suspended", obj=passport, reason=reason,
                details={"registry": registry_outcome.sentence},
            )  # fmt: skip
            emit("passport.suspended", passport_event(passport))
            detail = f"Suspended; {registry_outcome.sentence}."
        elif passport.status == Passport.Status.DRAFT:
            raise Refused(
                "The passport is a draft: only a published passport can be suspended.",
                code="passport_is_draft",
                status=409,
            )
        else:
            detail = "The passport was already suspended; nothing changed."
    return LifecycleResult(passport, took, detail)
