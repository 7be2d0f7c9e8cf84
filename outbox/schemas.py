"""The outbox's shapes that more than one surface shows (the API and `odal … --json`): one
schema each, camelCase names read from the model's attributes through their aliases."""

from datetime import datetime

from ninja import Field, Schema
from pydantic import field_validator

from odal import rules


class DeliveryFilterIn(Schema):
    """The filters of a bulk replay or resend, each checked by its rule (odal.rules)."""

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
    url: str
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


def consumer_json(consumer) -> dict:
    """A consumer as the API shows it, for `--json` on the command line."""
    return ConsumerOut.from_orm(consumer).model_dump(mode="json")
