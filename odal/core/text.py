"""Text from outside, made storable: the one boundary between what peers and clients send and
what odal writes to PostgreSQL or to its log.

PostgreSQL refuses two things a Python `str` can hold: the NUL character (text columns and
jsonb alike) and lone surrogates (U+D800–U+DFFF, which have no UTF-8 form, so psycopg cannot
even send them). Bytes from a peer may not be UTF-8 at all. Anything a webhook endpoint, the
registry or an exception says is passed through `storable()` (or `error_text()`/`excerpt()`,
built on it) before it ends in `last_error`, the attempt log, a note or the audit trail.

Input from clients is not repaired but refused: `unstorable()` names the first character
PostgreSQL cannot store, and `find_unstorable()` walks a JSON value (keys and values, any
depth) for one, so the API and the admin can say which field is wrong.
"""

import math
import re
import sys

REPLACEMENT = "\ufffd"
MAX_STORED = 2000  # the longest error, answer or note odal keeps from outside
MAX_ERROR = 500  # an exception's message
MAX_EXCERPT = 200  # what a peer's answer body contributes to an error
MAX_JSON_DEPTH = 64  # find_unstorable's bound on nesting: no real JSON input goes deeper
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(value, limit: int = MAX_STORED) -> str:
    """`value` as text PostgreSQL accepts: bytes decoded as UTF-8 with replacement, NUL and lone
    surrogates replaced by U+FFFD, and cut to at most `limit` characters (ending in "…" when cut)."""
    if isinstance(value, bytes | bytearray | memoryview):
        value = bytes(value).decode("utf-8", "replace")
    elif not isinstance(value, str):
        try:
            value = str(value)
        except Exception as exc:  # a hostile __str__ must not escape from here
            value = f"<unprintable {type(value).__name__}: {type(exc).__name__}>"
    text = _UNSTORABLE.sub(REPLACEMENT, value[: limit + 1])
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def excerpt(value, limit: int = MAX_EXCERPT) -> str:
    """A peer's answer body as a short one-line quote for an error message."""
    return storable(" ".join(storable(value, limit * 4).split()), limit)


def error_text(exc: BaseException, limit: int = MAX_ERROR) -> str:
    """An exception as "<Type>: <message>", storable."""
    return storable(f"{type(exc).__name__}: {storable(exc, limit)}", limit)


def unstorable(value: str) -> str | None:
    """Say which character of `value` PostgreSQL cannot store, or None if it can store it all."""
    match = _UNSTORABLE.search(value)
    if match is None:
        return None
    char = match.group()
    what = "the NUL character (\\u0000)" if char == "\x00" else f"a lone surrogate (\\u{ord(char):04x})"
    return f"contains {what}, which cannot be stored"


class RefusedNumber:
    """A number in JSON text that odal would not give back as it was sent, kept where it stood
    when the text was parsed (JSON_NUMBERS) so that find_unstorable names its place, and a bulk
    item holding one fails alone. Nothing stores it: it is always refused."""

    __slots__ = ("text", "problem")

    def __init__(self, text: str, problem: str):
        self.text = text  # as it was written, e.g. "NaN" or "1e400" (cut when long)
        self.problem = problem

    def __repr__(self) -> str:
        return f"RefusedNumber({self.text!r})"


# Numbers as json.loads reads them (`json.loads(text, **JSON_NUMBERS)`), each refused in place
# (a RefusedNumber) when odal would not give it back as it was sent. PostgreSQL's jsonb keeps a
# number as `numeric`: it has no negative zero (-0.0 would come back 0.0), and it writes a number
# out in full, so a float Python writes with an exponent (1e16 or more) would come back as an
# integer (1e308 as 309 digits). A refusal tells the sender which field at once; a number changed
# in storage would be found late, if ever (docs/runbook.md, "Numbers").
FLOAT_AS_INTEGER = 1e16  # from here on repr(float) has an exponent, which numeric writes out in full


def _json_constant(name: str) -> RefusedNumber:
    return RefusedNumber(name, f"is {name}, which is not a number JSON can carry")


def _json_float(text: str) -> float | RefusedNumber:
    value = float(text)
    if value in (float("inf"), float("-inf")):  # 1e400: valid JSON, but no float holds it
        return RefusedNumber(text[:50], f"is the number {text[:50]}, which is too large to store")
    if value == 0 and any(digit in "123456789" for digit in text.lower().partition("e")[0]):
        # 1e-400: valid JSON, but no float holds it (it would be read, and stored, as 0)
        return RefusedNumber(text[:50], f"is the number {text[:50]}, which is too small to store")
    if value == 0 and math.copysign(1, value) < 0:
        return _negative_zero(text)
    if abs(value) >= FLOAT_AS_INTEGER:
        digits = len(str(abs(int(value))))
        return RefusedNumber(
            text[:50],
            f"is the number {text[:50]}, which would be stored as an integer of {digits} digits; send an "
            "integer, or a string to keep it as written",
        )
    return value


def _json_integer(text: str) -> int | RefusedNumber:
    if text.startswith("-") and not text.strip("-0"):
        return _negative_zero(text)
    try:
        return int(text)
    except ValueError:  # more digits than Python reads: sys.get_int_max_str_digits(), 4,300
        digits = len(text.lstrip("-"))
        return RefusedNumber(
            f"{text[:20]}…",
            f"is an integer of {digits:,} digits, more than the {sys.get_int_max_str_digits():,} odal reads",
        )


def _negative_zero(text: str) -> RefusedNumber:
    return RefusedNumber(text, "is negative zero, which would be stored as 0; send 0")


JSON_NUMBERS = {"parse_constant": _json_constant, "parse_float": _json_float, "parse_int": _json_integer}


def find_unstorable(value, path: str = "", depth: int = 0, max_depth: int = 64) -> tuple[str, str] | None:
    """Walk a JSON value (dicts, lists, strings) and return (path, problem) for the first key or
    string PostgreSQL cannot store, number odal would not give back as sent (a RefusedNumber), or nesting deeper
    than `max_depth`; None if all is fine. Paths read like `payload.items[2].name`."""
    stack = [(value, path, depth)]
    while stack:
        item, where, level = stack.pop()
        if level > max_depth:
            return where or "body", f"is nested more than {max_depth} levels deep"
        if isinstance(item, str):
            problem = unstorable(item)
            if problem:
                return where or "body", problem
        elif isinstance(item, RefusedNumber):
            return where or "body", item.problem
        elif isinstance(item, dict):
            for key, inner in reversed(list(item.items())):
                key_text = str(key)
                shown = storable(key_text, 100)
                child = f"{where}.{shown}" if where else shown
                problem = unstorable(key_text)
                if problem:
                    return child, f"has a key that {problem}"
                stack.append((inner, child, level + 1))
        elif isinstance(item, list):
            for index in reversed(range(len(item))):
                stack.append((item[index], f"{where}[{index}]", level + 1))
    return None
