"""The registry outbox's routes: a passport's registration, abandon, record a handle, counts."""

import uuid
from datetime import datetime

from ninja import Router, Schema

from odal.core.auth import ScopedAuth
from odal.core.schemas import Error, responses
from registry import service
from registry.schemas import AbandonOut, RegistrationOut

router = Router(tags=["registry"])


class AbandonIn(Schema):
    reason: str | None = None


class AbandonRefusal(Error):
    correlationId: str | None = None
    candidates: list[str] | None = None
    retryAfter: datetime | None = None


class HandleRefusal(Error):
    retryAfter: datetime | None = None


class HandleIn(Schema):
    handle: str | None = None
    reason: str | None = None


class RegistryCountsOut(Schema):
    pending: int
    submitted: int
    registered: int
    rejected: int
    suspended: int
    deactivated: int
    abandoned: int
    stalled: int


@router.get(
    "dpp/{dppId}/registry",
    operation_id="getRegistration",
    auth=ScopedAuth("read", perm="registry.view_registration"),
    response=responses({200: RegistrationOut}, 404),
)
def get_registration(request, dppId: uuid.UUID):
    """The passport's registration and the registry's answers so far."""
    return service.registration_for(dppId)


@router.post(
    "dpp/{dppId}/registry/abandon",
    operation_id="abandonRegistration",
    auth=ScopedAuth("admin", perm="registry.abandon_registration"),
    response={**responses({200: AbandonOut}, 404, 501, 502, body=True), 409: AbandonRefusal},
)
def abandon_registration(request, dppId: uuid.UUID, payload: AbandonIn):
    """Give up a registration the registry provably never accepted. Checked in this order:
    404 no registration; 200 `alreadyAbandoned` (registry not asked, nothing written); 409 not a
    pending register, never attempted, due now, or an attempt in flight; 422 bad reason; 501 no
    registry queues; 502 registry unreadable (a page failed, the lookup's deadline or page limit
    passed, a cursor repeated; safe to retry); 409 the registry holds a submission (naming it) or
    several (naming them); 422 absence not proven (a task still unread, or a registry that cannot
    be searched); 409 `outcome_unknown` with `retryAfter` (the task list shows nothing, but an
    attempt whose outcome is unknown is younger than ODAL_REGISTRY_SETTLE_SECONDS: its register
    may still land); then the conditional update (409 `registration_changed` if the row is no longer
    the one read before the registry was asked). The passport stays published."""
    return service.abandon(dppId, actor=request.auth.actor, reason=payload.reason)


@router.post(
    "dpp/{dppId}/registry/handle",
    operation_id="recordHandle",
    auth=ScopedAuth("admin", perm="registry.record_handle"),
    response={**responses({200: RegistrationOut}, 404, body=True), 409: HandleRefusal},
)
def record_handle(request, dppId: uuid.UUID, payload: HandleIn):
    """Record by hand the registry handle a person read off the registry's portal: a submitted
    registration becomes registered; a deactivation whose finding cannot search the registry stays
    pending with that handle, due now, and the drain deactivates the registration by it. 409 on
    any other registration, while an attempt holds it, while its finding can still search the
    registry (`registry_searchable`), while a register whose outcome is unknown may still land
    (`outcome_unknown`, with `retryAfter`), or if it changed meanwhile; 422 bad handle or reason."""
    return service.record_handle(
        dppId, handle=payload.handle, actor=request.auth.actor, reason=payload.reason
    )


@router.get(
    "registry",
    operation_id="getRegistryCounts",
    auth=ScopedAuth("read", perm="registry.view_registration"),
    response=responses({200: RegistryCountsOut}),
)
def get_registry_counts(request):
    """Registrations per status; `stalled` counts pending rows that need a person (abandoned rows
    are counted apart, never as stalled)."""
    return service.registry_counts()
