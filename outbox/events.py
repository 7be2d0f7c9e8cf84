"""Emitting an event: the event row and its deliveries, in the caller's transaction."""

import uuid

from django.db import connection, transaction
from django.utils import timezone

from odal.core import rules
from odal.core.errors import Refused
from odal.core.ids import uuid7
from odal.core.rows import insert_rows
from odal.work.wake import SWEEP
from outbox.models import Consumer, Delivery, Event

EVENT_TYPE = rules.EVENT_TYPE  # matched with fullmatch: `$` would let a final newline through


def check_event_type(value: str) -> str:
    """An event type (odal.core.rules.event_type), or Refused (422 invalid_event_type) saying why not."""
    try:
        return rules.event_type(value)
    except ValueError as exc:
        raise Refused(
            f"{rules.shown(value)} is not an event type: it {exc}.", code="invalid_event_type", status=422
        ) from None


def check_event_pattern(value: str) -> str:
    """What a consumer subscribes to (odal.core.rules.event_pattern): an event type, a prefix such as
    passport.*, or *; or Refused (422 invalid_event_type) saying why not."""
    try:
        return rules.event_pattern(value)
    except ValueError as exc:
        raise Refused(
            f"{rules.shown(value)} is not an event pattern: it {exc}.", code="invalid_event_type", status=422
        ) from None


def share_lock(consumers: list) -> list:
    """Hold a key-share lock (what a foreign key check takes) on the consumers a publish fans out
    to, until it commits: a removal (outbox.service.remove_consumer locks the row for update)
    then waits for the publish and sees its deliveries, instead of the publish failing on the
    deferred foreign key at commit. Key-share locks block neither one another nor updates of the
    consumer. Returns those of `consumers` it locked: one removed since they were read (a
    removal that committed in between, or one the lock waited for) is not there to lock, and
    gets no delivery."""
    if not consumers:
        return consumers
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {Consumer._meta.db_table} WHERE id = ANY(%s) ORDER BY id FOR KEY SHARE",
            [sorted(c.pk for c in consumers)],
        )
        locked = {row[0] for row in cursor.fetchall()}
    return [c for c in consumers if c.pk in locked]


def emit(event_type: str, payload: dict, *, only=None, exclude=None) -> tuple[Event, int]:
    """Create the event and one delivery per consumer that subscribes to its type: pending and
    due now, or paused (parked until it resumes) for a paused consumer. Call it inside the
    transaction of the change it reports: if that rolls back, no event and no delivery remain.
    `only` (a consumer) sends it to that consumer alone, subscribed or not (a test event);
    `exclude` leaves one out. Returns the event and the number of deliveries."""
    check_event_type(event_type)
    with transaction.atomic():
        event = Event.objects.create(type=event_type, payload=payload)
        consumers = [only] if only is not None else [c for c in Consumer.objects.all() if c.wants(event_type)]
        if exclude is not None:
            consumers = [c for c in consumers if c.pk != exclude.pk]
        consumers = share_lock(consumers)
        Delivery.objects.bulk_create(
            Delivery(
                event=event,
                event_type=event.type,
                consumer=c,
                max_attempts=c.max_attempts,
                next_attempt_at=event.created_at,
                status=Delivery.Status.PAUSED if c.paused else Delivery.Status.PENDING,
            )
            for c in consumers
        )
        if any(not c.paused for c in consumers):
            SWEEP.on_commit()
    return event, len(consumers)


def emit_many(event_type: str, payloads: list[dict]) -> tuple[list[uuid.UUID], int]:
    """emit() for many events of one type at once (bulk intake): the events in one INSERT, one
    delivery per subscribed consumer and event in another, the sweep woken once for them all.
    Call it inside the transaction of the changes they report. Returns the events (in the order
    of `payloads`: their ids) and the number of deliveries."""
    check_event_type(event_type)
    if not payloads:
        return [], 0
    with transaction.atomic():
        now = timezone.now()
        events = [{"id": uuid7(), "payload": p} for p in payloads]
        insert_rows(Event, events, same={"type": event_type, "created_at": now})
        consumers = [c for c in Consumer.objects.all() if c.wants(event_type)]
        consumers = share_lock(consumers)
        insert_rows(
            Delivery,
            [
                {
                    "event_id": event["id"],
                    "consumer_id": c.pk,
                    "max_attempts": c.max_attempts,
                    "status": Delivery.Status.PAUSED if c.paused else Delivery.Status.PENDING,
                }
                for event in events
                for c in consumers
            ],
            same={"next_attempt_at": now, "created_at": now, "event_type": event_type},
        )
        if any(not c.paused for c in consumers):
            SWEEP.on_commit()
    return [event["id"] for event in events], len(events) * len(consumers)
