"""Schemas shared by every router: the error body, and small field checks."""

from ninja import Schema

from odal.upi import MAX_UPI_LENGTH, canonical_upi  # noqa: F401 (MAX_UPI_LENGTH is still importable here)


class Error(Schema):
    detail: str
    code: str


def check_upi(value: str) -> str:
    """The UPI in its canonical form (odal.upi), or ValueError saying what is wrong with it."""
    return canonical_upi(value)


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
