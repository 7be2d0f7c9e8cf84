"""Consumers as operators manage them, through the API: list, read, change, pause, resume,
rotate the signing secret, send a test event, remove; and resending deliveries. Every route is
a thin call of outbox.service, which the admin and the command line call too.

Consumers are addressed by their unique name. Each shape is one schema: camelCase names, read
from the model's attributes through their aliases, never a dict built beside it.
"""

import uuid
from datetime import datetime, timedelta

from django.http import HttpResponse
from django.utils.cache import add_never_cache_headers
from ninja import Field, Router, Schema, Status
from pydantic import field_validator, model_validator

from odal.core import rules
from odal.core.auth import ScopedAuth
from odal.core.errors import Refused
from odal.core.schemas import ReasonIn, responses
from outbox import service
from outbox.api import ConsumerIn, get_delivery_or_404
from outbox.models import Consumer, Delivery
from outbox.schemas import LATE_SUCCESSES, PREVIEW_WARNING, ConsumerOut, DeliveryFilterIn, SentAgainOut

router = Router(tags=["consumers"])


# -- shapes -----------------------------------------------------------------------------------------


class ConsumerCreatedOut(ConsumerOut):
    id: int
    secret: str = Field(description="The whsec_ signing secret: shown here once, never again.")


class ConsumerList(Schema):
    items: list[ConsumerOut]


class ConsumerPatch(Schema):
    url: str | None = None
    target: str | None = None
    eventTypes: list[str] | None = None
    maxAttempts: int | None = Field(default=None, ge=rules.ATTEMPTS[0], le=rules.ATTEMPTS[1])
    timeoutSeconds: int | None = Field(default=None, ge=rules.TIMEOUT_SECONDS[0], le=rules.TIMEOUT_SECONDS[1])
    reason: str | None = None

    @field_validator("maxAttempts", mode="before")
    @classmethod
    def _max_attempts(cls, value) -> int | None:
        return None if value is None else rules.attempt_budget(value)

    @field_validator("timeoutSeconds", mode="before")
    @classmethod
    def _timeout(cls, value) -> int | None:
        return None if value is None else rules.timeout_seconds(value)

    @field_validator("target")
    @classmethod
    def _target(cls, value: str | None) -> str | None:
        return value if not value else rules.python_target(value)

    @field_validator("reason", mode="before")
    @classmethod
    def _reason(cls, value) -> str | None:
        return None if value is None else rules.reason(value)


class RotateIn(ReasonIn):
    graceSeconds: int = Field(
        default=int(service.DEFAULT_GRACE.total_seconds()),
        ge=0,
        le=int(rules.GRACE[1].total_seconds()),
        description="How long the old secret keeps signing beside the new one (0: not at all).",
    )

    @field_validator("graceSeconds", mode="before")
    @classmethod
    def _grace(cls, value):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("must be a whole number of seconds")
        return value


class RotateOut(Schema):
    secret: str = Field(description="The new whsec_ signing secret: shown here once, never again.")
    previousSecretExpiresAt: datetime | None


class RemovedOut(Schema):
    name: str
    deliveriesRemoved: int


class TestEventOut(Schema):
    deliveryId: uuid.UUID


class BulkResendIn(ReasonIn, DeliveryFilterIn):
    status: str | None = Field(default=None, description="delivered or dead (default: both)")
    since: datetime | None = Field(default=None, description="created at or after")
    until: datetime | None = Field(default=None, description="created before")
    dryRun: bool = False

    @field_validator("status")
    @classmethod
    def _status(cls, value: str | None) -> str | None:
        if value is not None and value not in service.RESENDABLE:
            raise ValueError(f"must be one of {', '.join(service.RESENDABLE)}")
        return value

    @field_validator("since", "until")
    @classmethod
    def _moment(cls, value: datetime | None) -> datetime | None:
        return None if value is None else rules.moment(value)

    @model_validator(mode="after")
    def _window(self):
        if self.since and self.until and self.since >= self.until:
            raise ValueError("since must be before until")
        return self


class BulkResendOut(Schema):
    resent: int | None = None
    wouldResend: int | None = None
    lateSuccesses: int | None = Field(default=None, description=LATE_SUCCESSES)
    warning: str | None = Field(default=None, description=PREVIEW_WARNING)


# -- routes ------------------------------------------------------------------------------------------

VIEW = ScopedAuth("read", perm="outbox.view_consumer")
CHANGE = ScopedAuth("admin", perm="outbox.change_consumer")
PAUSE = ScopedAuth("admin", perm="outbox.pause_consumer")
REMOVE = ScopedAuth("admin", perm="outbox.delete_consumer")
RESEND = ScopedAuth("admin", perm="outbox.replay_delivery")


@router.post(
    "outbox/consumers",
    operation_id="createConsumer",
    auth=ScopedAuth("admin", perm="outbox.add_consumer"),
    response=responses({201: ConsumerCreatedOut}, 409, body=True),
)
def post_consumer(request, payload: ConsumerIn, response: HttpResponse):
    """Add a consumer. The response carries its signing secret, shown this once (no-store)."""
    add_never_cache_headers(response)
    consumer = service.create_consumer(
        name=payload.name,
        kind=payload.kind,
        url=payload.url,
        target=payload.target,
        event_types=payload.eventTypes,
        max_attempts=payload.maxAttempts,
        timeout_seconds=payload.timeoutSeconds,
        actor=request.auth.actor,
    )
    return Status(201, consumer)


@router.get(
    "outbox/consumers", operation_id="listConsumers", auth=VIEW, response=responses({200: ConsumerList})
)
def list_consumers(request):
    """Every consumer, by name (secrets are never shown again after creation or rotation)."""
    return {"items": list(Consumer.objects.order_by("name"))}


@router.get(
    "outbox/consumers/{name}",
    operation_id="getConsumer",
    auth=VIEW,
    response=responses({200: ConsumerOut}, 404),
)
def get_consumer(request, name: str, response: HttpResponse):
    """One consumer. Its `ETag` goes in PATCH's `If-Match`."""
    consumer = service.consumer_or_404(name)
    response["ETag"] = service.etag(consumer)
    return consumer


@router.patch(
    "outbox/consumers/{name}",
    operation_id="changeConsumer",
    auth=CHANGE,
    response=responses({200: ConsumerOut}, 404, 409, 412, body=True),
)
def change_consumer(request, name: str, payload: ConsumerPatch, response: HttpResponse):
    """Change a consumer's url (or target), event types, timeout or attempt budget; audited with
    what each was. Fields left out stay as they are. With `If-Match: <ETag of GET>`, a consumer
    changed since (paused, rotated, changed) is 412 precondition_failed and nothing is written."""
    consumer = service.consumer_or_404(name)
    changed = service.change_consumer(
        consumer,
        actor=request.auth.actor,
        reason=payload.reason or "",
        if_version=service.version_of_if_match(request.headers.get("If-Match"), consumer),
        url=payload.url,
        target=payload.target,
        event_types=payload.eventTypes,
        max_attempts=payload.maxAttempts,
        timeout_seconds=payload.timeoutSeconds,
    )
    response["ETag"] = service.etag(changed)
    return changed


@router.delete(
    "outbox/consumers/{name}",
    operation_id="removeConsumer",
    auth=REMOVE,
    response=responses({200: RemovedOut}, 404, 409, body=True),
)
def remove_consumer(request, name: str, payload: ReasonIn):
    """Remove a consumer with its settled deliveries; 409 while any is pending or paused."""
    consumer = service.consumer_or_404(name)
    removed = service.remove_consumer(consumer, actor=request.auth.actor, reason=payload.reason)
    return {"name": name, **removed}


@router.post(
    "outbox/consumers/{name}/pause",
    operation_id="pauseConsumer",
    auth=PAUSE,
    response=responses({200: ConsumerOut}, 404, body=True),
)
def pause_consumer(request, name: str, payload: ReasonIn):
    """Pause: its deliveries are still made but wait (status paused), spending no attempt and
    never dead-lettered. Pausing a paused consumer changes nothing."""
    consumer = service.consumer_or_404(name)
    service.pause(consumer, actor=request.auth.actor, reason=payload.reason)
    consumer.refresh_from_db()
    return consumer


@router.post(
    "outbox/consumers/{name}/resume",
    operation_id="resumeConsumer",
    auth=PAUSE,
    response=responses({200: ConsumerOut}, 404, body=True),
)
def resume_consumer(request, name: str, payload: ReasonIn):
    """Resume: its waiting deliveries are due again, in the order they were made."""
    consumer = service.consumer_or_404(name)
    service.resume(consumer, actor=request.auth.actor, reason=payload.reason)
    consumer.refresh_from_db()
    return consumer


@router.post(
    "outbox/consumers/{name}/rotate-secret",
    operation_id="rotateConsumerSecret",
    auth=CHANGE,
    response=responses({200: RotateOut}, 404, 409, body=True),
)
def rotate_secret(request, name: str, payload: RotateIn, response: HttpResponse):
    """A new signing secret, shown once (no-store). The old one keeps signing beside it for
    graceSeconds (default a day), so the consumer can switch without a failed delivery; 0 drops
    it at once. While an earlier rotation's grace runs, only graceSeconds 0 is taken: any other
    is 409 rotation_in_progress (with that grace's previousSecretExpiresAt), so no secret stops
    signing before the time it was announced valid until."""
    add_never_cache_headers(response)
    secret, expires = service.rotate_secret(
        service.consumer_or_404(name),
        actor=request.auth.actor,
        reason=payload.reason,
        grace=timedelta(seconds=payload.graceSeconds),
    )
    return {"secret": secret, "previousSecretExpiresAt": expires}


@router.post(
    "outbox/consumers/{name}/test-event",
    operation_id="sendTestEvent",
    auth=CHANGE,
    response=responses({201: TestEventOut}, 404),
)
def test_event(request, name: str):
    """An odal.test event to this consumer alone (it waits like the others while it is paused)."""
    delivery = service.send_test_event(service.consumer_or_404(name), actor=request.auth.actor)
    return Status(201, {"deliveryId": delivery.pk})


@router.post(
    "outbox/deliveries/{deliveryId}/resend",
    operation_id="resendDelivery",
    auth=RESEND,
    response=responses({200: SentAgainOut}, 404, 409, body=True),
)
def resend_delivery(request, deliveryId: uuid.UUID, payload: ReasonIn):
    """Send a delivered or dead delivery again: pending, due now, a fresh attempt budget, the
    same webhook-id (so the consumer deduplicates it as any retry). `warning` says so when it
    was dead although its consumer had answered 2xx to a late attempt."""
    delivery = get_delivery_or_404(deliveryId)
    if Delivery.objects.filter(pk=deliveryId).resend(actor=request.auth.actor, reason=payload.reason) == 0:
        raise Refused(
            f"Delivery {deliveryId} is {delivery.status}: only delivered or dead deliveries can be sent "
            "again (a pending or paused one is on its way).",
            code="not_settled",
            status=409,
        )
    resent = get_delivery_or_404(deliveryId)
    resent.warning = service.late_success_note(delivery, verb="resending")
    return resent


@router.post(
    "outbox/resend",
    operation_id="resendDeliveries",
    auth=RESEND,
    response=responses({200: BulkResendOut}, body=True),
)
def resend_by_filter(request, payload: BulkResendIn):
    """Send again every delivered or dead delivery matching the filter, with one reason.
    `dryRun` only counts, and warns of dead ones whose consumer answered 2xx to a late attempt
    (lateSuccesses, warning)."""
    rows = Delivery.objects.matching(
        statuses=[payload.status] if payload.status else service.RESENDABLE,
        consumer=payload.consumer,
        event_type=payload.eventType,
        since=payload.since,
        until=payload.until,
    )
    if payload.dryRun:
        return {"wouldResend": rows.count(), **service.late_success_preview(rows, verb="resending")}
    return {"resent": rows.resend(actor=request.auth.actor, reason=payload.reason)}
