"""Schemas shared by every router: the error body, and the field checks (odal.rules) under their
older names."""

from ninja import Schema

from odal import rules
from odal.upi import MAX_UPI_LENGTH  # noqa: F401 (still importable here)


class Error(Schema):
    detail: str
    code: str


def check_upi(value: str) -> str:
    """The UPI in its canonical form (odal.rules.upi), or ValueError saying what is wrong with it."""
    return rules.upi(value)


def check_text(value: str, *, max_length: int, required: bool) -> str:
    """One line of text (odal.rules.text), or ValueError saying what is wrong with it."""
    return rules.text(value, max_length=max_length, required=required)


def responses(ok: dict, *errors: int, body: bool = False) -> dict:
    """A route's documented answers: its own, plus what every route may answer (401 without
    credentials, 403 without the scope, 422 for invalid input) and, where it reads a body, 400
    for a body that is not JSON and 413 for one too large."""
    common = {401: Error, 403: Error, 422: Error, **({400: Error, 413: Error} if body else {})}
    return {**common, **{code: Error for code in errors}, **ok}
