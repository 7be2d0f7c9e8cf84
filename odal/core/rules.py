"""The input rules: what odal accepts from a person or a client, each defined once.

Every surface checks what it is given through these functions, so the API, the admin and the
command line accept and refuse the same values:
- the API's schemas, in pydantic field validators (a refusal is 422 `invalid_request`, naming
  the field);
- the admin's forms, in `clean_<field>` through `form_value()` (a form error under the field);
- the `odal` command line, as argparse types through `odal.core.cli.argument()` (a usage error: the
  sentence on stderr, exit 2).

A rule takes the value as it came (text from the command line, a number or text from JSON, a
form's cleaned value), returns it cleaned, and raises ValueError with a phrase that reads after
the value's name: "must be a whole number from 1 to 1,000". Lengths are the sizes of the columns
the values are stored in (tests/test_input_rules.py checks them against the models), so a value
that passes its rule is one PostgreSQL can store: a refusal, never a DataError.

Reasons are refused the same way on every surface, but as the write's own refusal (`Refused`,
422 `invalid_reason`, exit 1: odal.core.reasons.clean_reason), as CONTRACT.md lists them.
UPIs have their own module (odal.core.upi.canonical_upi): `upi()` here is that rule.
"""

import ipaddress
import re
import unicodedata
import uuid
from datetime import UTC, datetime, timedelta

from django import forms

from odal.core.text import unstorable
from odal.core.upi import canonical_upi

# -- the sizes: the columns the values are stored in ------------------------------------------------

CONSUMER_NAME_LENGTH = 100  # outbox.Consumer.name
PYTHON_TARGET_LENGTH = 200  # outbox.Consumer.target
EVENT_TYPE_LENGTH = 100  # outbox.Event.type
OPERATOR_ID_LENGTH = 200  # odal.Passport.operator_id
FACILITY_ID_LENGTH = 200  # odal.Passport.facility_id
COMMODITY_CODE_LENGTH = 50  # odal.Passport.commodity_code
TOKEN_NAME_LENGTH = 100  # odal.ApiToken.name
USERNAME_LENGTH = 150  # django.contrib.auth's User.username
ACTOR_LENGTH = 100  # "cli:<actor>" in odal.AuditEntry.actor (200), with room to spare
MAX_REASON_LENGTH = 500  # what a person writes as a reason (the audit trail keeps it whole)
HOST_LENGTH = 253  # the longest DNS name

# -- the ranges -----------------------------------------------------------------------------------

ATTEMPTS = (1, 1000)  # a delivery's attempt budget: 0 would dead-letter it unattempted
TIMEOUT_SECONDS = (1, 60)  # a webhook's timeout
BATCH = (1, 10_000)  # rows a sweep or a drain claims per pass
BULK = (1, 1_000)  # passports per request of POST dpp/bulk, and per transaction of `odal passport import`
PORT = (1, 65_535)  # a TCP port to listen on (0, "any free one", is not a port a person asks for)
LATENCY_MS = (0, 60_000)  # the registry simulator's --latency-ms
WEB_WORKERS = (1, 256)  # gunicorn worker processes of one `odal serve`; each holds a database connection
# How old a row must be for retention to delete it by hand (`odal outbox purge --older-than`): 0
# would delete what was just settled; past a century the cutoff is no longer a date.
RETENTION = (timedelta(minutes=1), timedelta(days=36_500))

# A control character: C0/C1 controls, format characters (zero-width, bidi overrides), surrogates,
# private use, and the Unicode line and paragraph separators. None belongs in one line of text.
CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})
CONTROL_PROBLEM = "must not contain control characters (a line break, a tab or an escape)"

IDENTIFIERS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")  # a.b.c (ASCII)
DOTTED_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")  # module.callable
NAME = re.compile(r"[A-Za-z0-9_-]+")  # a consumer's name: it is also a URL path segment
EVENT_TYPE = re.compile(r"[a-z0-9_]+(?:\.[a-z0-9_]+)*")  # always fullmatch: `$` allows a final \n
WHOLE_NUMBER = re.compile(r"\s*[+-]?[0-9]{1,30}\s*")
IPV6_CHARACTERS = re.compile(r"[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]{1,15})?")  # ...and its scope
HOST_LABEL = re.compile(r"[A-Za-z0-9_-]{1,63}")  # one label of a host name or an IPv4 address
DURATION = re.compile(r"\s*([0-9]{1,9})\s*([dhms])\s*", re.IGNORECASE)  # 9 digits of days fit a timedelta
DURATION_UNITS = {  # the largest first
    "d": (timedelta(days=1), "day"),
    "h": (timedelta(hours=1), "hour"),
    "m": (timedelta(minutes=1), "minute"),
    "s": (timedelta(seconds=1), "second"),
}


def has_control_character(value: str) -> bool:
    return any(unicodedata.category(ch) in CONTROL_CATEGORIES for ch in value)


def shown(value, limit: int = 40) -> str:
    """`value` quoted for a message, control characters escaped, cut to about `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- text -------------------------------------------------------------------------------------------


def text(value, *, max_length: int, required: bool = False) -> str:
    """One line of plain text: stripped, at most `max_length` characters, no control characters."""
    if not isinstance(value, str):
        raise ValueError("must be text")
    value = value.strip()
    if required and not value:
        raise ValueError("must not be blank")
    if len(value) > max_length:
        raise ValueError(f"must be at most {max_length:,} characters (it has {len(value):,})")
    if problem := unstorable(value):
        raise ValueError(problem)
    if has_control_character(value):
        raise ValueError(CONTROL_PROBLEM)
    return value


def operator_id(value) -> str:
    return text(value, max_length=OPERATOR_ID_LENGTH, required=True)


def facility_id(value) -> str:
    return text(value, max_length=FACILITY_ID_LENGTH)


def commodity_code(value) -> str:
    return text(value, max_length=COMMODITY_CODE_LENGTH)


def token_name(value) -> str:
    return text(value, max_length=TOKEN_NAME_LENGTH, required=True)


def username(value) -> str:
    return text(value, max_length=USERNAME_LENGTH, required=True)


TOKEN_PREFIX = re.compile(r"[0-9a-f]{8}")


def token_prefix(value) -> str:
    """A token's prefix, as `odal token list` shows it: the 8 hexadecimal characters after odal_."""
    if not isinstance(value, str) or not TOKEN_PREFIX.fullmatch(value.strip()):
        raise ValueError(
            "is not a token's prefix (the 8 hexadecimal characters after odal_, as odal token list shows)"
        )
    return value.strip()


def actor(value) -> str:
    """Who did it, as an operator names themself (`--actor`): kept in the audit trail."""
    return text(value, max_length=ACTOR_LENGTH, required=True)


def python_target(value) -> str:
    """A python consumer's dotted path. Whether ODAL_PYTHON_CONSUMERS allows it (checked before
    anything is imported) and whether it imports are the consumer's own checks
    (outbox.consumers.python_callable), refused as invalid_target on every surface."""
    value = text(value, max_length=PYTHON_TARGET_LENGTH, required=True)
    if not DOTTED_PATH.fullmatch(value):
        raise ValueError("must be a dotted path to a callable, such as package.module.function")
    return value


def python_allow_list_names(allowed: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What the allow-list names, the one reading of its entries: (the dotted paths named exactly,
    the prefixes a target may start with: each `prefix.*` without its `*`)."""
    paths = tuple(entry for entry in allowed if not entry.endswith(".*"))
    prefixes = tuple(entry[:-1] for entry in allowed if entry.endswith(".*"))
    return paths, prefixes


def python_target_allowed(target: str, allowed: tuple[str, ...]) -> bool:
    """Whether an entry of the allow-list names `target` (ConsumerQuerySet.python_outside: in SQL)."""
    paths, prefixes = python_allow_list_names(allowed)
    return target in paths or target.startswith(prefixes)


def python_module_allowed(module: str, allowed: tuple[str, ...]) -> bool:
    """Whether the module a callable is defined in lies under a `prefix.*` entry of the list."""
    return f"{module}.".startswith(python_allow_list_names(allowed)[1])


def python_allow_list(value: str) -> tuple[str, ...]:
    """ODAL_PYTHON_CONSUMERS: comma-separated dotted paths (a callable each) or `prefix.*` (every
    callable under a package or module)."""
    entries = tuple(entry.strip() for entry in value.split(","))
    for entry in entries:
        if not (DOTTED_PATH.fullmatch(entry) or (entry.endswith(".*") and IDENTIFIERS.fullmatch(entry[:-2]))):
            raise ValueError(
                "must be comma-separated dotted paths (package.module.function) or prefixes "
                f"(package.module.*); {shown(entry)} is neither"
            )
    return entries


def consumer_name(value) -> str:
    """A new consumer's name: ASCII letters, digits, - and _ (it is addressed in URLs)."""
    problem = f"must be 1 to {CONSUMER_NAME_LENGTH} letters (a-z, A-Z), digits, - or _, without spaces"
    if not isinstance(value, str):
        raise ValueError(problem)
    value = value.strip()
    if len(value) > CONSUMER_NAME_LENGTH or not NAME.fullmatch(value):
        raise ValueError(problem)
    return value


def consumer_filter(value) -> str:
    """A consumer named to look it up (a filter; blank: no filter): text that fits the name's
    column. Not consumer_name(): a name that breaks it finds nothing (or a consumer made before
    the rule), but a value no column could hold is malformed."""
    return text(value, max_length=CONSUMER_NAME_LENGTH)


def event_type_filter(value) -> str:
    """An event type named to filter by (blank: no filter): text that fits the type's column."""
    return text(value, max_length=EVENT_TYPE_LENGTH)


# -- event types ------------------------------------------------------------------------------------


def event_type(value) -> str:
    """An event type: lower-case dotted names, e.g. passport.published. Not stripped: the type is
    what consumers match exactly."""
    if isinstance(value, str) and (problem := unstorable(value)):
        raise ValueError(problem)
    if not isinstance(value, str) or len(value) > EVENT_TYPE_LENGTH or not EVENT_TYPE.fullmatch(value):
        raise ValueError(
            "must be lower-case dotted names such as passport.published "
            f"(letters a-z, digits and _; at most {EVENT_TYPE_LENGTH} characters)"
        )
    return value


def event_pattern(value) -> str:
    """What a consumer subscribes to: an event type, a prefix such as passport.*, or *."""
    if value == "*":
        return value
    if not isinstance(value, str):
        raise ValueError("must be an event type, a prefix such as passport.*, or *")
    if problem := unstorable(value):
        raise ValueError(problem)
    try:
        event_type(value.removesuffix(".*"))
    except ValueError:
        raise ValueError(
            "must be an event type such as passport.published, a prefix such as passport.*, or * "
            f"(lower-case dotted names; at most {EVENT_TYPE_LENGTH} characters)"
        ) from None
    return value


# -- numbers ----------------------------------------------------------------------------------------


def whole_number(value, low: int, high: int) -> int:
    """A whole number from `low` to `high`: an int, an integral float (JSON's 5.0), or its digits
    as text (the command line's)."""
    problem = f"must be a whole number from {low:,} to {high:,}"
    digits = isinstance(value, str) and WHOLE_NUMBER.fullmatch(value)
    if digits or (isinstance(value, float) and value.is_integer()):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(problem)
    return value


def attempt_budget(value) -> int:
    return whole_number(value, *ATTEMPTS)


def timeout_seconds(value) -> int:
    return whole_number(value, *TIMEOUT_SECONDS)


def batch_size(value) -> int:
    return whole_number(value, *BATCH)


def bulk_batch(value) -> int:
    return whole_number(value, *BULK)


def port(value) -> int:
    return whole_number(value, *PORT)


def latency_ms(value) -> int:
    return whole_number(value, *LATENCY_MS)


def rate_per_second(value) -> int:
    """Requests per second, written N/s (or N alone), N from 1 to 1,000,000."""
    problem = "must be a rate such as 100/s: a whole number of requests per second from 1 to 1,000,000"
    if not isinstance(value, str):
        raise ValueError(problem)
    number, sep, unit = value.strip().partition("/")
    if sep and unit.strip() != "s":
        raise ValueError(problem)
    try:
        return whole_number(number.strip(), 1, 1_000_000)
    except ValueError:
        raise ValueError(problem) from None


def web_workers(value) -> int:
    return whole_number(value, *WEB_WORKERS)


def listenable_host(host: str) -> bool:
    """A host to listen on as gunicorn reads it: an IPv6 address in brackets, or a host name or
    IPv4 address whose labels have 1 to 63 characters (an empty or longer label is no name: the
    resolver itself raises on it). An IPv6 address without brackets is not: gunicorn would take
    its first colon for the port's."""
    if host.startswith("[") and host.endswith("]"):
        if not IPV6_CHARACTERS.fullmatch(host[1:-1]):  # (ipaddress takes any scope after a %)
            return False
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
        return True
    labels = host.removesuffix(".").split(".")  # (a fully qualified name may end with a dot)
    return len(host) <= HOST_LENGTH and all(HOST_LABEL.fullmatch(label) for label in labels)


def address(value) -> str:
    """HOST:PORT (or PORT alone) to serve on, e.g. 127.0.0.1:8000; returned as HOST:PORT."""
    problem = (
        "must be HOST:PORT (or a port alone), e.g. 127.0.0.1:8000 or [::1]:8000, with a port from 1 to 65,535"
    )
    if not isinstance(value, str):
        raise ValueError(problem)
    host, sep, number = value.strip().rpartition(":")
    host = host if sep else "127.0.0.1"
    if not listenable_host(host):
        raise ValueError(problem)
    try:
        return f"{host}:{port(number)}"
    except ValueError:
        raise ValueError(problem) from None


# -- ids, UPIs, times -------------------------------------------------------------------------------


def uuid_id(value, what: str = "id") -> uuid.UUID:
    """A row's id (a UUID), e.g. a passport's or a delivery's."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(value.strip())
    except (AttributeError, ValueError):
        raise ValueError(f"is not a {what} (a UUID)") from None


def passport_id(value) -> uuid.UUID:
    return uuid_id(value, "passport id")


def delivery_id(value) -> uuid.UUID:
    return uuid_id(value, "delivery id")


def upi(value) -> str:
    """A passport's UPI, in its canonical form (odal.core.upi)."""
    return canonical_upi(value)


def moment(value) -> datetime:
    """A point in time in ISO 8601 (a datetime, or its text), returned in UTC; one without an
    offset is read as UTC. A time that cannot be made UTC (0001-01-01T00:00:00+14:00 is before
    year 1 there) is refused, not an OverflowError later."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError("is not an ISO 8601 time, e.g. 2026-11-29T08:00:00Z") from None
    if not isinstance(value, datetime):
        raise ValueError("is not an ISO 8601 time, e.g. 2026-11-29T08:00:00Z")
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("is out of range once made UTC (years 1 to 9999 only)") from None


def duration_text(value: timedelta, *, words: bool = False) -> str:
    """A duration in the largest unit that divides it: 30d, 90m (or "30 days", "90 minutes")."""
    for unit, (size, name) in DURATION_UNITS.items():
        if value % size == timedelta(0):
            n = value // size
            return f"{n:,} {name}{'s' if n != 1 else ''}" if words else f"{n}{unit}"
    return f"{value.total_seconds():g} seconds" if words else f"{value.total_seconds():g}s"


def duration(value, low: timedelta, high: timedelta) -> timedelta:
    """A length of time: a whole number and a unit, d (days), h (hours), m (minutes) or s
    (seconds), e.g. 30d, 12h, 90m. A bare number is refused: 30 what?"""
    problem = (
        "must be a duration such as 30d, 12h or 90m (a whole number and d, h, m or s), "
        f"from {duration_text(low, words=True)} to {duration_text(high, words=True)}"
    )
    found = DURATION.fullmatch(value) if isinstance(value, str) else None
    if not found:
        raise ValueError(problem)
    length = int(found[1]) * DURATION_UNITS[found[2].lower()][0]
    if not low <= length <= high:
        raise ValueError(problem)
    return length


GRACE = (timedelta(0), timedelta(days=30))


def grace_period(value) -> timedelta:
    """How long a rotated-out signing secret still signs (0s: not at all)."""
    return duration(value, *GRACE)


def retention_period(value) -> timedelta:
    """How old a settled row must be for `odal outbox purge` to delete it."""
    return duration(value, *RETENTION)


# -- reasons ----------------------------------------------------------------------------------------


def reason(value) -> str:
    """A person's reason for an override: required, one line, printable, at most 500 characters.
    The phrases read after "A reason" (odal.core.reasons.clean_reason makes the sentence)."""
    if value is None:
        raise ValueError("is required")
    if not isinstance(value, str):
        raise ValueError("must be text")
    value = value.strip()
    if not value:
        raise ValueError("is required: say why, in a sentence")
    if len(value) > MAX_REASON_LENGTH:
        raise ValueError(f"must be at most {MAX_REASON_LENGTH} characters (it has {len(value):,})")
    if problem := unstorable(value):
        raise ValueError(problem)
    if has_control_character(value):
        raise ValueError(f"{CONTROL_PROBLEM}: write it on one line of plain text")
    return value


# -- the admin's forms ------------------------------------------------------------------------------


def form_value(rule, value, *args):
    """`rule(value)` for a form's clean_<field>: a refusal is the field's error."""
    try:
        return rule(value, *args)
    except ValueError as exc:
        raise forms.ValidationError(f"This value {exc}.") from None
