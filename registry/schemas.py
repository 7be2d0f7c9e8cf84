"""The registry outbox's shapes that more than one surface shows (the API, a passport's summary,
`odal registry show`): one schema each, camelCase names read from the model's attributes through
their aliases.

Each also reads back its own JSON (field names, not aliases): an idempotent route's stored answer
is validated against its schema again when the key is repeated (odal.core.idempotency). So what a
field derives from the row is done by validators, which see both, not by ninja's resolvers,
which would be handed the stored dict as if it were the row."""

import uuid
from datetime import datetime

from ninja import Field, Schema
from pydantic import ConfigDict, field_validator, model_validator

from registry.models import RegistrationQuerySet


class RegistrationSummaryOut(Schema):
    """A passport's registration, as `GET dpp/{dppId}` shows it."""

    model_config = ConfigDict(validate_by_name=True)

    status: str
    operation: str
    attempts: int
    nextAttemptAt: datetime | None = Field(
        alias="next_attempt_at",
        description="When the drain takes it up again; only while pending or submitted.",
    )
    lastError: str = Field(alias="last_error")
    correlationId: str | None = Field(alias="correlation_id")
    handle: str | None
    note: str
    lastUnknownAt: datetime | None = Field(default=None, alias="last_unknown_at")
    settlesAt: datetime | None = Field(default=None, alias="settles_at")

    @field_validator("correlationId", "handle", mode="before")
    @classmethod
    def _none_when_blank(cls, value: str | None) -> str | None:
        return value or None  # the columns keep "" for "not known yet"

    @model_validator(mode="after")
    def _due_only_while_owed(self):
        if self.status not in RegistrationQuerySet.claimable_statuses:  # a settled row's is a leftover
            self.nextAttemptAt = None
        return self


class RegistrationAttemptOut(Schema):
    model_config = ConfigDict(validate_by_name=True)

    number: int
    operation: str
    startedAt: datetime = Field(alias="started_at")
    finishedAt: datetime = Field(alias="finished_at")
    outcome: str
    answer: str
    late: bool


class RegistrationOut(RegistrationSummaryOut):
    """The registration and every line of its attempt log (`unknown`: the request may have reached
    the registry, no answer of its own came back; `late`: its claim was superseded), oldest first."""

    attemptLog: list[RegistrationAttemptOut] = Field(default=[], alias="attempt_log")


class AbandonOut(Schema):
    # Read from registry.service.AbandonResult (the registration as abandon left it: abandoned).
    dppId: uuid.UUID = Field(alias="registration.passport_id")
    status: str = Field(alias="registration.status")
    alreadyAbandoned: bool = Field(alias="already_abandoned")
    attempts: int
    passportStatus: str = Field(alias="registration.passport.status")
    detail: str
