"""Schemas shared by every router: the error body, and the field checks (odal.core.rules) under their
older names."""

from ninja import Schema
from pydantic import BaseModel, field_validator

from odal.core import rules
from odal.core.upi import MAX_UPI_LENGTH  # noqa: F401 (still importable here)


class Error(Schema):
    detail: str
    code: str


class PassportIn(BaseModel):
    """A new passport, as `POST dpp` takes it and as each item of `POST dpp/bulk` (and each row of
    `odal passport import`) gives it."""

    upi: str
    operatorId: str
    facilityId: str | None = None
    commodityCode: str | None = None
    data: dict | None = None

    @field_validator("upi")
    @classmethod
    def _upi(cls, value: str) -> str:
        return rules.upi(value)

    @field_validator("operatorId")
    @classmethod
    def _operator(cls, value: str) -> str:
        return rules.operator_id(value)

    @field_validator("facilityId")
    @classmethod
    def _facility(cls, value: str | None) -> str | None:
        return None if value is None else rules.facility_id(value)

    @field_validator("commodityCode")
    @classmethod
    def _commodity(cls, value: str | None) -> str | None:
        return None if value is None else rules.commodity_code(value)


class ReasonIn(Schema):
    """A person's reason for an override, kept in the audit trail: required, one line, at most
    500 characters."""

    # Checked here, before the route runs (422 invalid_request naming `reason`), by the rule every
    # surface uses (odal.core.rules.reason); the write checks it again for the admin and the CLI.
    reason: str

    @field_validator("reason", mode="before")
    @classmethod
    def _reason(cls, value) -> str:
        return rules.reason(value)


def field_of(loc) -> str:
    """Where a validation error is, as the API names it: `upi`, `items.3`, `request`."""
    parts = [str(p) for p in loc if p not in ("body", "payload", "path", "query")]
    return ".".join(parts) or "request"


def invalid_request(errors, lead: str = "The request is not valid.") -> dict:
    """The API's 422 body for pydantic's validation errors: a sentence naming each field, the code
    `invalid_request`, and the errors one by one."""
    problems = []
    for error in errors:
        message = str(error.get("msg", "is not valid")).removeprefix("Value error, ")
        problems.append(f"{field_of(error.get('loc', ()))}: {message}")
    return {
        "detail": f"{lead} " + "; ".join(problems) + ".",
        "code": "invalid_request",
        "errors": [{"field": field_of(e.get("loc", ())), "message": str(e.get("msg"))} for e in errors],
    }


def check_upi(value: str) -> str:
    """The UPI in its canonical form (odal.core.rules.upi), or ValueError saying what is wrong with it."""
    return rules.upi(value)


def check_text(value: str, *, max_length: int, required: bool) -> str:
    """One line of text (odal.core.rules.text), or ValueError saying what is wrong with it."""
    return rules.text(value, max_length=max_length, required=required)


def responses(ok: dict, *errors: int, body: bool = False) -> dict:
    """A route's documented answers: its own, plus what every route may answer (401 without
    credentials, 403 without the scope, 422 for invalid input) and, where it reads a body, 400
    for a body that is not JSON and 413 for one too large."""
    common = {401: Error, 403: Error, 422: Error, **({400: Error, 413: Error} if body else {})}
    return {**common, **{code: Error for code in errors}, **ok}
