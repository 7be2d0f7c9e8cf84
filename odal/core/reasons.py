"""The reason a person gives for an override: required, one line, printable, not too long.

The rule itself is odal.core.rules.reason (one definition for every surface); a bad reason is the
write's refusal: 422 `invalid_reason` in the API, exit 1 on the command line (CONTRACT.md)."""

from odal.core import rules
from odal.core.errors import Refused

MAX_REASON_LENGTH = rules.MAX_REASON_LENGTH


def clean_reason(value) -> str:
    """Return the reason stripped, or raise Refused (422, code invalid_reason) saying what is wrong."""
    try:
        return rules.reason(value)
    except ValueError as exc:
        raise Refused(f"A reason {exc}.", code="invalid_reason", status=422) from None
