"""The outbox's shapes that more than one surface shows (the API and `odal … --json`): one
schema each, camelCase names read from the model's attributes through their aliases."""

import uuid
from datetime import datetime

from ninja import Field, Schema
from pydantic import field_validator

from odal.core import rules
from odal.core.redact import may_see_whole_urls, redacted_url
from outbox.models import Consumer, Delivery


class DeliveryFilterIn(Schema):
    """The filters of a bulk replay or resend, each checked by its rule (odal.core.rules)."""

    consumer: str | None = None
    eventType: str | None = None

    @field_validator("consumer")
    @classmethod
    def _consumer(cls, value: str | None) -> str | None:
        return None if value is None else rules.consumer_filter(value)

    @field_validator("eventType")
    @classmethod
    def _event_type(cls, value: str | None) -> str | None:
        return None if value is None else rules.event_type_filter(value)


class ConsumerOut(Schema):
    name: str
    kind: str
    url: str = Field(
        description="Whole only to admin scope and to staff who may change consumers; to everyone else "
        "its whole userinfo, every path parameter's value and every query value read *** "
        "(`http://***@host/hook;key=***?token=***`)."
    )
    target: str
    eventTypes: list[str] = Field(alias="event_types")
    maxAttempts: int = Field(alias="max_attempts")
    timeoutSeconds: int = Field(alias="timeout_seconds")
    paused: bool
    pausedReason: str = Field(alias="paused_reason")
    pausedBy: str = Field(alias="paused_by")
    pausedAt: datetime | None = Field(alias="paused_at")
    previousSecretExpiresAt: datetime | None = Field(
        alias="previous_secret_expires_at",
        description="While a rotated-out secret still signs (both signatures are sent), until when.",
    )
    createdAt: datetime = Field(alias="created_at")

    @staticmethod
    def resolve_url(consumer: Consumer, context) -> str:
        """Redacted unless the caller may see it whole (an API request's caller, or `whole_url`
        from a surface of its own: the command line, whose user holds the database)."""
        context = context or {}
        if context.get("whole_url") or (context.get("request") and may_see_whole_urls(context["request"])):
            return consumer.url
        return redacted_url(consumer.url)


class DeliveryOut(Schema):
    """A delivery, read from the model: each field names the attribute it comes from."""

    id: uuid.UUID
    eventId: uuid.UUID = Field(alias="event_id")
    eventType: str = Field(alias="event.type")
    consumer: str = Field(alias="consumer.name")
    status: str
    attempts: int
    maxAttempts: int = Field(alias="max_attempts")
    nextAttemptAt: datetime | None = Field(description="When it is due; only while pending.")
    lastError: str = Field(alias="last_error")
    deliveredAt: datetime | None = Field(alias="delivered_at")
    deadAt: datetime | None = Field(alias="dead_at")
    lateSuccessAt: datetime | None = Field(
        alias="late_success_at",
        description="When the consumer last answered 2xx to a late attempt (one that outlived its claim, "
        "or whose row was settled meanwhile). On a dead delivery: the consumer has it after all, and a "
        "replay or resend sends it again.",
    )
    createdAt: datetime = Field(alias="created_at")

    @staticmethod
    def resolve_nextAttemptAt(d: Delivery) -> datetime | None:  # noqa: N802 (ninja's resolve_<field>)
        return d.next_attempt_at if d.status == Delivery.Status.PENDING else None


class AttemptOut(Schema):
    number: int
    startedAt: datetime = Field(alias="started_at")
    finishedAt: datetime = Field(alias="finished_at")
    outcome: str
    error: str
    httpStatus: int | None = Field(alias="http_status")
    durationMs: int = Field(alias="duration_ms")
    late: bool
    answer: str = Field(description="An excerpt of what the consumer answered (its body, bounded).")
    contentType: str = Field(alias="content_type", description="The answer's Content-Type, if it had one.")


class DeliveryDetailOut(DeliveryOut):
    attemptLog: list[AttemptOut] = Field(alias="attempt_log")


class SentAgainOut(DeliveryDetailOut):
    """A delivery just replayed or resent."""

    warning: str | None = Field(
        default=None,
        description="Set when it was dead although its consumer had answered 2xx to a late attempt "
        "(lateSuccessAt): the consumer gets it again.",
    )


LATE_SUCCESSES = (
    "Dry runs: how many of the dead deliveries it would send again were answered 2xx by their "
    "consumer after all, by a late attempt (lateSuccessAt)."
)
PREVIEW_WARNING = "Dry runs: a sentence for a person when lateSuccesses is not 0."


def delivery_json(delivery: Delivery) -> dict:
    """A delivery with its attempt log as the API shows it, for `--json` on the command line."""
    return DeliveryDetailOut.from_orm(delivery).model_dump(mode="json")


def consumer_json(consumer) -> dict:
    """A consumer as the API shows it to admin scope, for `--json` on the command line."""
    return ConsumerOut.from_orm(consumer, context={"whole_url": True}).model_dump(mode="json")
