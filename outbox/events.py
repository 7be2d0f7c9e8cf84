"""Emitting an event: the event row and its deliveries, in the caller's transaction."""

import re

from django.db import transaction

from odal.errors import Refused
from outbox.kick import kick_sweep_on_commit
from outbox.models import Consumer, Delivery, Event

EVENT_TYPE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)*$")


def check_event_type(value: str) -> str:
    if not isinstance(value, str) or not EVENT_TYPE.match(value) or len(value) > 100:
        raise Refused(
            f"{value!r} is not an event type: use lower-case dotted names such as passport.published "
            "(at most 100 characters).",
            code="invalid_event_type",
            status=422,
        )
    return value


def check_event_pattern(value: str) -> str:
    """What a consumer subscribes to: an event type, a prefix such as passport.*, or *."""
    if value != "*":
        check_event_type(value.removesuffix(".*"))
    return value


def emit(event_type: str, payload: dict) -> tuple[Event, int]:
    """Create the event and one pending delivery, due now, per active consumer that subscribes
    to its type. Call it inside the transaction of the change it reports: if that rolls back,
    no event and no delivery remain. Returns the event and the number of deliveries."""
    check_event_type(event_type)
    with transaction.atomic():
        event = Event.objects.create(type=event_type, payload=payload)
        consumers = [c for c in Consumer.objects.filter(active=True) if c.wants(event_type)]
        Delivery.objects.bulk_create(
            Delivery(event=event, consumer=c, max_attempts=c.max_attempts, next_attempt_at=event.created_at)
            for c in consumers
        )
        if consumers:
            kick_sweep_on_commit()
    return event, len(consumers)
