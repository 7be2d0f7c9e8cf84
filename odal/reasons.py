"""The reason a person gives for an override: required, one line, printable, not too long."""

import unicodedata

from odal.errors import Refused

MAX_REASON_LENGTH = 500


def clean_reason(value) -> str:
    """Return the reason stripped, or raise Refused (422, code invalid_reason) saying what is wrong."""
    if value is None:
        raise Refused("A reason is required.", code="invalid_reason", status=422)
    if not isinstance(value, str):
        raise Refused("The reason must be text.", code="invalid_reason", status=422)
    reason = value.strip()
    if not reason:
        raise Refused("A reason is required: say why, in a sentence.", code="invalid_reason", status=422)
    if len(reason) > MAX_REASON_LENGTH:
        raise Refused(
            f"The reason is {len(reason)} characters long; keep it to {MAX_REASON_LENGTH}.",
            code="invalid_reason",
            status=422,
        )
    if any(unicodedata.category(ch) in {"Cc", "Cf", "Cs", "Co"} for ch in reason):
        raise Refused(
            "The reason contains control characters (a line break, a tab or an escape); "
            "write it on one line of plain text.",
            code="invalid_reason",
            status=422,
        )
    return reason
