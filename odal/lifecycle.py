"""The passport lifecycle: publish and suspend.

Each is one transaction: the passport's guarded status update, its audit entry, the event it
emits and the registry work it queues commit together or not at all.
"""

from dataclasses import dataclass

from django.db import transaction

from odal.errors import Refused
from odal.models import AuditEntry, Passport
from outbox.events import emit


@dataclass
class LifecycleResult:
    passport: Passport
    changed: bool
    detail: str


def _get(dpp_id) -> Passport:
    passport = Passport.objects.filter(pk=dpp_id).first()
    if passport is None:
        raise Refused(f"No passport {dpp_id}.", code="not_found", status=404)
    return passport


def passport_event(passport: Passport) -> dict:
    return {
        "dppId": str(passport.pk),
        "upi": passport.upi,
        "operatorId": passport.operator_id,
        "status": passport.status,
    }


def publish(dpp_id, *, actor: str, reason: str = "") -> LifecycleResult:
    with transaction.atomic():
        took = Passport.objects.filter(pk=dpp_id).mark_published() == 1
        passport = _get(dpp_id)
        if took:
            AuditEntry.objects.record(actor=actor, action="passport_published", obj=passport, reason=reason)
            emit("passport.published", passport_event(passport))
            detail = "Published."
        else:
            detail = "The passport was already published; nothing changed."
    return LifecycleResult(passport, took, detail)


def suspend(dpp_id, *, actor: str, reason: str = "") -> LifecycleResult:
    with transaction.atomic():
        took = Passport.objects.filter(pk=dpp_id).mark_suspended() == 1
        passport = _get(dpp_id)
        if took:
            AuditEntry.objects.record(actor=actor, action="passport_suspended", obj=passport, reason=reason)
            emit("passport.suspended", passport_event(passport))
            detail = "Suspended."
        elif passport.status == Passport.Status.DRAFT:
            raise Refused(
                "The passport is a draft: only a published passport can be suspended.",
                code="passport_is_draft",
                status=409,
            )
        else:
            detail = "The passport was already suspended; nothing changed."
    return LifecycleResult(passport, took, detail)
