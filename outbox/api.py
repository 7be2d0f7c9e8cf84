"""The outbox's routes: events in, consumers, counts, the delivery lists and replay."""

import uuid
from datetime import datetime

from django.db.models import Prefetch, Q
from django.http import HttpResponse
from django.utils import timezone
from ninja import Field, Query, Router, Schema
from pydantic import field_validator

from odal.core import rules
from odal.core.auth import ScopedAuth
from odal.core.cursors import decode_cursor, encode_cursor
from odal.core.errors import Refused
from odal.core.idempotency import IdempotencyKey, idempotent
from odal.core.schemas import ReasonIn, responses
from outbox import service
from outbox.events import emit
from outbox.models import Consumer, Delivery, Event
from outbox.schemas import (
    LATE_SUCCESSES,
    PREVIEW_WARNING,
    DeliveryDetailOut,
    DeliveryFilterIn,
    DeliveryOut,
    SentAgainOut,
)
from outbox.service import outbox_counts

router = Router(tags=["outbox"])


# -- shapes -----------------------------------------------------------------------------------------


class DeliveryPage(Schema):
    items: list[DeliveryOut]
    nextCursor: str | None


DEAD_LATE_SUCCESSES = (
    "Of the dead, those whose consumer answered 2xx to a late attempt (lateSuccessAt): it has them."
)


class ConsumerCounts(Schema):
    name: str
    isPaused: bool
    pausedReason: str
    pausedBy: str
    pending: int
    delivered: int
    dead: int
    paused: int
    deadLateSuccesses: int = Field(description=DEAD_LATE_SUCCESSES)
    oldestPendingAt: datetime | None


class OutboxCountsOut(Schema):
    pending: int
    delivered: int
    dead: int
    paused: int
    deadLateSuccesses: int = Field(description=DEAD_LATE_SUCCESSES)
    oldestPendingAt: datetime | None
    consumers: list[ConsumerCounts]


class EventIn(Schema):
    type: str
    payload: dict = Field(default_factory=dict)


class EventOut(Schema):
    id: uuid.UUID
    type: str
    deliveries: int


class ConsumerIn(Schema):
    name: str
    kind: str = "webhook"
    url: str | None = None
    target: str | None = None
    eventTypes: list[str] = Field(default_factory=list)  # checked by create_consumer: invalid_event_type
    # The bounds are documented here and checked by the rule (odal.core.rules), which runs first.
    maxAttempts: int | None = Field(default=None, ge=rules.ATTEMPTS[0], le=rules.ATTEMPTS[1])
    timeoutSeconds: int = Field(default=10, ge=rules.TIMEOUT_SECONDS[0], le=rules.TIMEOUT_SECONDS[1])

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return rules.consumer_name(value)

    @field_validator("target")
    @classmethod
    def _target(cls, value: str | None) -> str | None:
        return value if not value else rules.python_target(value)

    @field_validator("maxAttempts", mode="before")
    @classmethod
    def _max_attempts(cls, value) -> int | None:
        return None if value is None else rules.attempt_budget(value)

    @field_validator("timeoutSeconds", mode="before")
    @classmethod
    def _timeout(cls, value) -> int:
        return rules.timeout_seconds(value)

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if value not in Consumer.Kind.values:
            raise ValueError("must be webhook or python")
        return value


class BulkReplayIn(DeliveryFilterIn):
    reason: str | None = None
    deadSince: datetime | None = None
    dryRun: bool = False

    @field_validator("deadSince")
    @classmethod
    def _dead_since(cls, value: datetime | None) -> datetime | None:
        return None if value is None else rules.moment(value)


class BulkReplayOut(Schema):
    replayed: int | None = None
    wouldReplay: int | None = None
    lateSuccesses: int | None = Field(default=None, description=LATE_SUCCESSES)
    warning: str | None = Field(default=None, description=PREVIEW_WARNING)


# -- configuration ----------------------------------------------------------------------------------


# -- cursor pagination -------------------------------------------------------------------------------


# -- routes ------------------------------------------------------------------------------------------


@router.post(
    "events",
    operation_id="createEvent",
    auth=ScopedAuth("write", perm="outbox.post_event"),
    response=responses({201: EventOut}, 409, body=True),
)
def post_event(request, payload: EventIn, response: HttpResponse, idempotency_key: IdempotencyKey = None):
    """Emit an event: one delivery per consumer that subscribes to its type (parked, not sent,
    while that consumer is paused). With an `Idempotency-Key`, a repeat creates nothing."""
    with idempotent(request, response, "POST events", payload, idempotency_key) as idempotency:
        if idempotency.replay is not None:
            return idempotency.replay
        event, deliveries = emit(payload.type, payload.payload)
        return idempotency.answer(201, {"id": event.pk, "type": event.type, "deliveries": deliveries})


@router.get(
    "outbox",
    operation_id="getOutboxCounts",
    auth=ScopedAuth("read", perm="outbox.view_delivery"),
    response=responses({200: OutboxCountsOut}),
)
def get_outbox(request):
    """Deliveries per status, overall and per consumer."""
    return outbox_counts()


@router.get(
    "outbox/deliveries",
    operation_id="listDeliveries",
    auth=ScopedAuth("read", perm="outbox.view_delivery"),
    response=responses({200: DeliveryPage}),
)
def list_deliveries(
    request,
    status: str | None = None,
    consumer: str | None = None,
    eventType: str | None = None,
    eventId: uuid.UUID | None = None,
    cursor: str | None = None,
    limit: int = Query(50, ge=1, le=200),
):
    """Deliveries, newest first. `?status=dead` is the dead-letter list; `?eventId=` the
    deliveries of one event."""
    rows = Delivery.objects.select_related("event", "consumer").order_by("-created_at", "-id")
    if status:
        if status not in Delivery.Status.values:
            raise Refused(
                f"status must be one of {', '.join(Delivery.Status.values)}.",
                code="invalid_status",
                status=422,
            )
        rows = rows.filter(status=status)
    if consumer:
        rows = rows.filter(consumer__name=consumer)
    if eventType:
        rows = rows.filter(event_type=eventType)  # delivery_type_idx
    if eventId:
        rows = rows.filter(event_id=eventId)
    if cursor:
        at, pk = decode_cursor(cursor)
        rows = rows.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=pk))
    page = list(rows[: limit + 1])
    next_cursor = encode_cursor(page[limit - 1]) if len(page) > limit else None
    return {"items": page[:limit], "nextCursor": next_cursor}


def get_delivery_or_404(delivery_id) -> Delivery:
    delivery = (
        Delivery.objects.select_related("event", "consumer")
        .prefetch_related("attempt_log")
        .filter(pk=delivery_id)
    ).first()
    if delivery is None:
        raise Refused(f"No delivery {delivery_id}.", code="not_found", status=404)
    return delivery


@router.get(
    "outbox/deliveries/{deliveryId}",
    operation_id="getDelivery",
    auth=ScopedAuth("read", perm="outbox.view_delivery"),
    response=responses({200: DeliveryDetailOut}, 404),
)
def get_delivery(request, deliveryId: uuid.UUID):
    """One delivery with its attempt log (late attempts included)."""
    return get_delivery_or_404(deliveryId)


@router.post(
    "outbox/deliveries/{deliveryId}/replay",
    operation_id="replayDelivery",
    auth=ScopedAuth("admin", perm="outbox.replay_delivery"),
    response=responses({200: SentAgainOut}, 404, 409, body=True),
)
def replay_delivery(request, deliveryId: uuid.UUID, payload: ReasonIn):
    """Replay a dead delivery: pending, due now, with a fresh attempt budget. Reason required.
    `warning` says so when its consumer had answered 2xx to a late attempt (it gets it again)."""
    delivery = get_delivery_or_404(deliveryId)
    if Delivery.objects.filter(pk=deliveryId).replay(actor=request.auth.actor, reason=payload.reason) == 0:
        raise Refused(
            f"Delivery {deliveryId} is {delivery.status}, not dead: only dead deliveries can be replayed.",
            code="not_dead",
            status=409,
        )
    replayed = get_delivery_or_404(deliveryId)
    replayed.warning = service.late_success_note(delivery, verb="replaying")
    return replayed


@router.post(
    "outbox/replay",
    operation_id="replayDeliveries",
    auth=ScopedAuth("admin", perm="outbox.replay_delivery"),
    response=responses({200: BulkReplayOut}, 409, body=True),
)
def replay_by_filter(request, payload: BulkReplayIn):
    """Replay every dead delivery matching the filter, with one reason. `dryRun` only counts,
    and warns of those whose consumer answered 2xx to a late attempt (lateSuccesses, warning)."""
    rows = Delivery.objects.matching(
        consumer=payload.consumer, event_type=payload.eventType, dead_since=payload.deadSince
    )
    if payload.dryRun:
        return {
            "wouldReplay": rows.filter(status=Delivery.Status.DEAD).count(),
            **service.late_success_preview(rows, verb="replaying"),
        }
    return {"replayed": rows.replay(actor=request.auth.actor, reason=payload.reason, at=timezone.now())}


# -- events -----------------------------------------------------------------------------------------


class EventDetailOut(Schema):
    """An event as it was emitted, with its deliveries (one per consumer it was fanned out to)."""

    # Read from the Event itself: each field names the model attribute it comes from.
    id: uuid.UUID
    type: str
    payload: dict
    createdAt: datetime = Field(alias="created_at")
    deliveries: list[DeliveryOut]  # in the shape of the delivery list


@router.get(
    "events/{eventId}",
    operation_id="getEvent",
    auth=ScopedAuth("read", perm="outbox.view_delivery"),
    response=responses({200: EventDetailOut}, 404),
)
def get_event(request, eventId: uuid.UUID):
    """One event with its deliveries, one per consumer it was fanned out to (by consumer name)."""
    deliveries = Prefetch(
        "deliveries", Delivery.objects.select_related("consumer").order_by("consumer__name")
    )
    event = Event.objects.filter(pk=eventId).prefetch_related(deliveries).first()
    if event is None:
        raise Refused(f"No event {eventId}.", code="not_found", status=404)
    return event
