"""The outbox's routes: events in, consumers, counts, the delivery lists and replay."""

import base64
import binascii
import uuid
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from ninja import Field, Query, Router, Schema, Status
from pydantic import field_validator

from odal import rules
from odal.auth import ScopedAuth
from odal.errors import Refused
from odal.models import AuditEntry
from odal.schemas import responses
from outbox.consumers import check_python_target, check_webhook_url
from outbox.events import check_event_pattern, emit
from outbox.models import Consumer, Delivery
from outbox.service import outbox_counts

router = Router(tags=["outbox"])


# -- shapes -----------------------------------------------------------------------------------------


def delivery_json(d: Delivery) -> dict:
    return {
        "id": d.pk,
        "eventId": d.event_id,
        "eventType": d.event.type,
        "consumer": d.consumer.name,
        "status": d.status,
        "attempts": d.attempts,
        "maxAttempts": d.max_attempts,
        "nextAttemptAt": d.next_attempt_at if d.status == Delivery.Status.PENDING else None,
        "lastError": d.last_error,
        "deliveredAt": d.delivered_at,
        "deadAt": d.dead_at,
        "createdAt": d.created_at,
    }


def delivery_detail_json(d: Delivery) -> dict:
    return {
        **delivery_json(d),
        "attemptLog": [
            {
                "number": a.number,
                "startedAt": a.started_at,
                "finishedAt": a.finished_at,
                "outcome": a.outcome,
                "error": a.error,
                "httpStatus": a.http_status,
                "durationMs": a.duration_ms,
                "late": a.late,
            }
            for a in d.attempt_log.all()
        ],
    }


class DeliveryOut(Schema):
    id: uuid.UUID
    eventId: uuid.UUID
    eventType: str
    consumer: str
    status: str
    attempts: int
    maxAttempts: int
    nextAttemptAt: datetime | None
    lastError: str
    deliveredAt: datetime | None
    deadAt: datetime | None
    createdAt: datetime


class AttemptOut(Schema):
    number: int
    startedAt: datetime
    finishedAt: datetime
    outcome: str
    error: str
    httpStatus: int | None
    durationMs: int
    late: bool


class DeliveryDetailOut(DeliveryOut):
    attemptLog: list[AttemptOut]


class DeliveryPage(Schema):
    items: list[DeliveryOut]
    nextCursor: str | None


class ConsumerCounts(Schema):
    name: str
    isPaused: bool
    pausedReason: str
    pausedBy: str
    pending: int
    delivered: int
    dead: int
    paused: int
    oldestPendingAt: datetime | None


class OutboxCountsOut(Schema):
    pending: int
    delivered: int
    dead: int
    paused: int
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
    # The bounds are documented here and checked by the rule (odal.rules), which runs first.
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


class ConsumerOut(Schema):
    id: int
    name: str
    kind: str
    url: str
    target: str
    eventTypes: list[str]
    maxAttempts: int
    timeoutSeconds: int
    paused: bool
    secret: str = Field(description="The whsec_ signing secret: shown here once, never again.")


class ReasonIn(Schema):
    reason: str | None = None


class BulkReplayIn(Schema):
    reason: str | None = None
    consumer: str | None = None
    eventType: str | None = None
    deadSince: datetime | None = None
    dryRun: bool = False

    @field_validator("consumer")
    @classmethod
    def _consumer(cls, value: str | None) -> str | None:
        return None if value is None else rules.consumer_filter(value)

    @field_validator("eventType")
    @classmethod
    def _event_type(cls, value: str | None) -> str | None:
        return None if value is None else rules.event_type_filter(value)

    @field_validator("deadSince")
    @classmethod
    def _dead_since(cls, value: datetime | None) -> datetime | None:
        return None if value is None else rules.moment(value)


class BulkReplayOut(Schema):
    replayed: int | None = None
    wouldReplay: int | None = None


# -- configuration ----------------------------------------------------------------------------------


def create_consumer(
    *, name, kind, url, target, event_types, max_attempts, timeout_seconds, actor
) -> Consumer:
    """Validate and create a consumer, audited. Shared by the API and `odal outbox consumer add`."""
    if kind == Consumer.Kind.WEBHOOK:
        if not url:
            raise Refused("A webhook consumer needs a url.", code="invalid_consumer", status=422)
        url, target = check_webhook_url(url), ""
    else:
        if not target:
            raise Refused(
                "A python consumer needs a target (a dotted path).", code="invalid_consumer", status=422
            )
        target, url = check_python_target(target), ""
    for pattern in event_types:
        check_event_pattern(pattern)
    fields = {"timeout_seconds": timeout_seconds}
    if max_attempts is not None:
        fields["max_attempts"] = max_attempts
    try:
        with transaction.atomic():
            consumer = Consumer.objects.create(
                name=name, kind=kind, url=url, target=target, event_types=list(event_types), **fields
            )
            AuditEntry.objects.record(
                actor=actor,
                action="consumer_created",
                obj=consumer,
                details={"kind": kind, "url": url, "target": target, "eventTypes": list(event_types)},
            )
    except IntegrityError:
        raise Refused(f"A consumer named {name!r} already exists.", code="consumer_exists") from None
    return consumer


def deliveries_matching(*, consumer=None, event_type=None, dead_since=None):
    rows = Delivery.objects.all()
    if consumer:
        if not Consumer.objects.filter(name=consumer).exists():
            raise Refused(f"No consumer named {consumer!r}.", code="unknown_consumer", status=422)
        rows = rows.filter(consumer__name=consumer)
    if event_type:
        rows = rows.filter(event__type=event_type)
    if dead_since:
        rows = rows.filter(dead_at__gte=dead_since)
    return rows


# -- cursor pagination -------------------------------------------------------------------------------


def encode_cursor(d: Delivery) -> str:
    return base64.urlsafe_b64encode(f"{d.created_at.isoformat()}|{d.pk}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        at, pk = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        return rules.moment(at), rules.uuid_id(pk)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise Refused("The cursor is not one this API gave out.", code="invalid_cursor", status=422) from None


# -- routes ------------------------------------------------------------------------------------------


@router.post(
    "events",
    auth=ScopedAuth("write", perm="outbox.post_event"),
    response=responses({201: EventOut}, body=True),
)
def post_event(request, payload: EventIn):
    """Emit an event: one delivery per consumer that subscribes to its type (parked, not sent,
    while that consumer is paused)."""
    event, deliveries = emit(payload.type, payload.payload)
    return Status(201, {"id": event.pk, "type": event.type, "deliveries": deliveries})


@router.post(
    "outbox/consumers",
    auth=ScopedAuth("admin", perm="outbox.add_consumer"),
    response=responses({201: ConsumerOut}, 409, body=True),
)
def post_consumer(request, payload: ConsumerIn):
    """Add a consumer. The response carries its signing secret, shown this once."""
    consumer = create_consumer(
        name=payload.name,
        kind=payload.kind,
        url=payload.url,
        target=payload.target,
        event_types=payload.eventTypes,
        max_attempts=payload.maxAttempts,
        timeout_seconds=payload.timeoutSeconds,
        actor=request.auth.actor,
    )
    return Status(
        201,
        {
            "id": consumer.pk,
            "name": consumer.name,
            "kind": consumer.kind,
            "url": consumer.url,
            "target": consumer.target,
            "eventTypes": consumer.event_types,
            "maxAttempts": consumer.max_attempts,
            "timeoutSeconds": consumer.timeout_seconds,
            "paused": consumer.paused,
            "secret": consumer.secret,
        },
    )


@router.get(
    "outbox", auth=ScopedAuth("read", perm="outbox.view_delivery"), response=responses({200: OutboxCountsOut})
)
def get_outbox(request):
    """Deliveries per status, overall and per consumer."""
    return outbox_counts()


@router.get(
    "outbox/deliveries",
    auth=ScopedAuth("read", perm="outbox.view_delivery"),
    response=responses({200: DeliveryPage}),
)
def list_deliveries(
    request,
    status: str | None = None,
    consumer: str | None = None,
    eventType: str | None = None,
    cursor: str | None = None,
    limit: int = Query(50, ge=1, le=200),
):
    """Deliveries, newest first. `?status=dead` is the dead-letter list."""
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
        rows = rows.filter(event__type=eventType)
    if cursor:
        at, pk = decode_cursor(cursor)
        rows = rows.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=pk))
    page = list(rows[: limit + 1])
    next_cursor = encode_cursor(page[limit - 1]) if len(page) > limit else None
    return {"items": [delivery_json(d) for d in page[:limit]], "nextCursor": next_cursor}


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
    auth=ScopedAuth("read", perm="outbox.view_delivery"),
    response=responses({200: DeliveryDetailOut}, 404),
)
def get_delivery(request, deliveryId: uuid.UUID):
    """One delivery with its attempt log (late attempts included)."""
    return delivery_detail_json(get_delivery_or_404(deliveryId))


@router.post(
    "outbox/deliveries/{deliveryId}/replay",
    auth=ScopedAuth("admin", perm="outbox.replay_delivery"),
    response=responses({200: DeliveryDetailOut}, 404, 409, body=True),
)
def replay_delivery(request, deliveryId: uuid.UUID, payload: ReasonIn):
    """Replay a dead delivery: pending, due now, with a fresh attempt budget. Reason required."""
    delivery = get_delivery_or_404(deliveryId)
    if Delivery.objects.filter(pk=deliveryId).replay(actor=request.auth.actor, reason=payload.reason) == 0:
        raise Refused(
            f"Delivery {deliveryId} is {delivery.status}, not dead: only dead deliveries can be replayed.",
            code="not_dead",
            status=409,
        )
    return delivery_detail_json(get_delivery_or_404(deliveryId))


@router.post(
    "outbox/replay",
    auth=ScopedAuth("admin", perm="outbox.replay_delivery"),
    response=responses({200: BulkReplayOut}, 409, body=True),
)
def replay_by_filter(request, payload: BulkReplayIn):
    """Replay every dead delivery matching the filter, with one reason. `dryRun` only counts."""
    rows = deliveries_matching(
        consumer=payload.consumer, event_type=payload.eventType, dead_since=payload.deadSince
    )
    if payload.dryRun:
        return {"wouldReplay": rows.filter(status=Delivery.Status.DEAD).count()}
    return {"replayed": rows.replay(actor=request.auth.actor, reason=payload.reason, at=timezone.now())}
