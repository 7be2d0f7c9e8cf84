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

import re

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


class NotFiniteNumber:
    """A number in JSON text that no float carries (NaN, Infinity, 1e400), kept where it stood
    when the text was parsed (odal.middleware.checked_json) so that find_unstorable names its
    place, and a bulk item holding one fails alone. Nothing stores it: it is always refused."""

    __slots__ = ("text", "problem")

    def __init__(self, text: str, problem: str):
        self.text = text  # as it was written, e.g. "NaN" or "1e400"
        self.problem = problem

    def __repr__(self) -> str:
        return f"NotFiniteNumber({self.text!r})"


def find_unstorable(value, path: str = "", depth: int = 0, max_depth: int = 64) -> tuple[str, str] | None:
    """Walk a JSON value (dicts, lists, strings) and return (path, problem) for the first key or
    string PostgreSQL cannot store, number no float carries (a NotFiniteNumber), or nesting deeper
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
        elif isinstance(item, NotFiniteNumber):
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
