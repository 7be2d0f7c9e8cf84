"""Schemas shared by every router: the error body, and small field checks."""

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import URLValidator
from ninja import Schema

_https = URLValidator(schemes=["https"])
MAX_UPI_LENGTH = 2000


class Error(Schema):
    detail: str
    code: str


def check_upi(value: str) -> str:
    value = value.strip()
    if len(value) > MAX_UPI_LENGTH:
        raise ValueError(f"must be at most {MAX_UPI_LENGTH} characters")
    try:
        _https(value)
    except DjangoValidationError:
        raise ValueError("must be an https URL, for example a GS1 Digital Link") from None
    return value


def check_text(value: str, *, max_length: int, required: bool) -> str:
    value = value.strip()
    if required and not value:
        raise ValueError("must not be blank")
    if len(value) > max_length:
        raise ValueError(f"must be at most {max_length} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError("must not contain control characters")
    return value


def responses(ok: dict, *errors: int, body: bool = False) -> dict:
    """A route's documented answers: its own, plus what every route may answer (401 without
    credentials, 403 without the scope, 422 for invalid input) and, where it reads a body, 400
    for a body that is not JSON and 413 for one too large."""
    common = {401: Error, 403: Error, 422: Error, **({400: Error, 413: Error} if body else {})}
    return {**common, **{code: Error for code in errors}, **ok}
