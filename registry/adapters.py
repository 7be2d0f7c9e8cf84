"""Talking to the registry: the `http` adapter (CONTRACT.md's wire protocol, over httpx) and the
`none` adapter (a node without registry queues).

Every failure is mapped (docs/reliability.md, "What an answer means", has the table): a refusal
in the registry's own JSON error (CONTRACT's wire protocol: an object whose `code` is a string)
is `Retryable`; anything else that is not the call's answer, whatever its status (HTML,
an empty body, plain text, JSON of another shape: a gateway's page, a proxy's error), a redirect,
a 502, 504 or another gateway's status, a timeout or a broken connection after sending, is
`OutcomeUnknown` (a Retryable): the request may have reached the registry without an answer of
the registry's own coming back. A 429 is `RateLimited`, whoever says it. Anything odd while
reading the task list makes `find_submission` raise `RegistryUnreadable` rather than guess; 404,
405 or 501 on its first page is `Unsupported` (the registry cannot be searched). An answer that is
not the protocol's (not JSON, another content type, JSON nested deeper than the parser goes,
values of the wrong type, ids longer than odal's columns or with control characters) is checked
before anything is written, and its message starts with PROTOCOL_ERROR: the attempt log's lines
that do are counted as registry_protocol_errors_total. Every message is made of odal.core.text's
storable pieces: it ends in last_error and the attempt log as it is.
"""

import json
import math
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import quote

import httpx
from django.conf import settings

from odal.core.redact import HIDDEN, SHORTEST_SECRET
from odal.core.text import error_text, excerpt, storable
from odal.core.upi import upi_key
from odal.work.http import DeadlineTransport, read_answer, redirect_text, within

MAX_TASK_PAGES = 1000  # and ODAL_REGISTRY_LOOKUP_SECONDS: the lookup's two bounds
ANSWER_CAP = 1024 * 1024  # a task-list page of 200 items is a few tens of KiB
MAX_ID = 500  # the correlation_id and handle columns (and record handle's limit)
MAX_CURSOR = 2000  # a task-list cursor is sent back in the query string
PROTOCOL_ERROR = "protocol error: "  # how an answer that is not the wire protocol's is told apart
TASK_STATUSES = ("received", "checking", "registered", "rejected")
# A connection the adapter closes is reset, not shut down: what it had not got through yet (a
# register the network held back while the adapter timed out) is dropped, not sent on once the
# network heals. Otherwise a register odal counts as failed could still reach the registry, after
# an abandon's lookup found nothing there (make partition cuts links mid-request).
RESET_ON_CLOSE = [(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))]
RETRY_AFTER_DEFAULT = 1.0  # seconds every drain waits after a 429 that says nothing (or nonsense),
# and at least, whatever it says: a 429 costs no attempt, so a registry answering 429 with
# "Retry-After: 0" (or a date gone by) would otherwise be asked again at once, for ever, each time
# with an attempt-log line (hundreds a second per registration)
RETRY_AFTER_CAP = 300.0  # ...and at most this long, whatever it says (the claim hold's default)


class Retryable(Exception):
    """The registry did not answer usefully; the attempt failed and may be retried."""


class OutcomeUnknown(Retryable):
    """The request may have reached the registry and no answer of the registry's own came back: a
    timeout or a broken connection after the request was sent, a redirect, a gateway's status (502,
    504, 520-527, 530), or, whatever the status, an answer that is not the registry's own JSON (a
    gateway's or a proxy's page, an empty body, JSON of another shape). A register may still land: until ODAL_REGISTRY_SETTLE_SECONDS have passed, absence in the task list proves
    nothing (registry.service.ask_registry, the drain's find)."""


# Failures of a request that never left: no connection was opened (or none could be had from the
# pool), or httpx could not even build the request. The registry cannot have seen it.
NOT_SENT_ERRORS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    httpx.LocalProtocolError,
    httpx.ProxyError,
)
# A gateway's own statuses (Bad Gateway, Gateway Timeout, Cloudflare's 520-527 and 530): whatever
# the body says, the gateway answered, and the request may have been passed on.
GATEWAY_STATUSES = (502, 504, *range(520, 528), 530)
UNSEARCHABLE_STATUSES = (404, 405, 501)  # a task list answering these cannot be searched


class Redirected(OutcomeUnknown):
    """The registry (or something in front of it) answered a redirect, which is not followed:
    not the registry's answer, and whatever answered may have passed the request on."""


class UnknownRequest(Retryable):
    """check: the registry answered, in its own JSON error, 404: it does not know the request."""


class RateLimited(Retryable):
    """The registry answered 429: it did not act on the request and asks every client to wait
    `retry_after` seconds (its Retry-After, capped)."""

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


def retry_after_seconds(value: str | None, *, now: datetime | None = None) -> float:
    """A Retry-After header as seconds to wait: delay-seconds or an HTTP-date (RFC 9110), from
    RETRY_AFTER_DEFAULT to RETRY_AFTER_CAP; RETRY_AFTER_DEFAULT when it is missing or unreadable."""
    text = (value or "").strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return RETRY_AFTER_DEFAULT
        if when.tzinfo is None:  # an HTTP-date is GMT; an obsolete format may come without a zone
            when = when.replace(tzinfo=UTC)
        waited = (when - (now or datetime.now(UTC))).total_seconds()
        return min(RETRY_AFTER_CAP, max(RETRY_AFTER_DEFAULT, waited))
    if not (math.isfinite(seconds) and seconds >= 0):  # delay-seconds are never negative
        return RETRY_AFTER_DEFAULT
    return min(RETRY_AFTER_CAP, max(RETRY_AFTER_DEFAULT, seconds))


class RegistryUnreadable(Exception):
    """The task list could not be read completely; nothing can be concluded. Safe to retry."""


class NoRegistry(Exception):
    """This node has no registry queues (ODAL_REGISTRY_ADAPTER=none)."""


# -- answers ------------------------------------------------------------------------------------


@dataclass
class Accepted:
    request_id: str


@dataclass
class Duplicate:
    request_id: str


@dataclass
class Rejected:
    errors: str


@dataclass
class CheckAnswer:
    status: str  # checking, registered, rejected
    registration_id: str = ""
    errors: str = ""
    deactivated: bool = False  # registered, and the registry has deactivated that registration since


@dataclass
class Found:
    correlation_id: str


@dataclass
class Ambiguous:
    candidates: list[str]


@dataclass
class NotFound:
    exhaustive: bool
    why: str = ""


@dataclass
class Unsupported:
    why: str = ""


@dataclass
class Answer:
    """What the registry answered: status, content type, and the body (read with a cap)."""

    status_code: int
    content_type: str
    body: bytes
    headers: httpx.Headers = field(default_factory=httpx.Headers)

    def said(self, what: str) -> str:
        return f"registry answered HTTP {self.status_code} to {what}"

    def own_error(self) -> dict | None:
        """The registry's own JSON error, as CONTRACT's wire protocol has it (`{code, ...}`: a JSON
        object whose `code` is a string, UNAVAILABLE, DUPLICATE_UPI), or None: HTML, an empty body,
        plain text, JSON of another shape (no code, a numeric one) are not the registry's."""
        try:
            payload = HttpRegistry._json(self, "")
        except Retryable:
            return None
        code = payload.get("code")
        return payload if isinstance(code, str) and code.strip() else None

    def refusal(self, what: str) -> Retryable:
        """What an answer other than the call's own means (the table in docs/reliability.md): a
        429 pauses every drain; a gateway's status, or a body that is not the registry's own
        JSON error, whatever the status, is an outcome unknown (what answered may have passed
        the request on); the registry's own JSON error is its refusal (failed)."""
        said, quoted = self.said(what), f": {excerpt(self.body)}" if self.body.strip() else ""
        if self.status_code == 429:
            # Whoever answers 429 (the registry, or a rate limit in front of it) did not act on it.
            retry_after = retry_after_seconds(self.headers.get("retry-after"))
            return RateLimited(
                f"registry answered HTTP 429 (too many requests): every drain waits {retry_after:g}s "
                f"(Retry-After: {storable(self.headers.get('retry-after') or 'none', 60)})",
                retry_after,
            )
        if self.status_code in GATEWAY_STATUSES:
            return OutcomeUnknown(
                f"{said} (a gateway's answer: the request may have reached the registry){quoted}"
            )
        if not 400 <= self.status_code < 600:
            # A 2xx the call does not expect (203 is a transforming proxy's copy of the origin's
            # 200), a 1xx, a status past 599: whatever its body, not the registry's refusal.
            return OutcomeUnknown(
                f"{said}, not a status the protocol has for it: the request may have reached the "
                f"registry{quoted}"
            )
        if self.own_error() is None:
            kind = storable(self.content_type.partition(";")[0].strip().lower(), 100) or "none"
            return OutcomeUnknown(
                f"{said} with content type {kind}, not the registry's own JSON error (a gateway's or a "
                f"proxy's answer?): the request may have reached the registry{quoted}"
            )
        return Retryable(f"{said}{quoted}")


@dataclass
class HttpRegistry:
    base_url: str
    token: str
    timeout: float = 10.0
    lookup_seconds: float | None = None  # find_submission's deadline; None: ODAL_REGISTRY_LOOKUP_SECONDS
    connections: int = 8  # kept open at most (the drain's requests in flight)
    client: httpx.Client | None = field(default=None, repr=False)
    made: threading.Lock = field(default_factory=threading.Lock, repr=False)  # the drain's threads share it

    name = "http"

    def _client(self) -> httpx.Client:
        with self.made:
            if self.client is None:
                self.client = httpx.Client(
                    base_url=self.base_url,
                    timeout=self.timeout,
                    # (with a transport of its own, a client's limits are the transport's; each
                    # request ends within its timeout, all of it: `within` in _send)
                    transport=DeadlineTransport(
                        limits=httpx.Limits(
                            max_connections=self.connections, max_keepalive_connections=self.connections
                        ),
                        socket_options=RESET_ON_CLOSE,
                    ),
                    headers={
                        "Authorization": f"Bearer {self.token}",
                        "User-Agent": "odal-registry/1",
                        "Accept-Encoding": "identity",  # read_answer's cap holds for raw bytes
                        # No cache in front of the registry answers a read from what it kept: a
                        # task list of before a register landed is no proof for abandon.
                        "Cache-Control": "no-cache",
                    },
                )
            return self.client

    def _without_token(self, body: bytes) -> bytes:
        """The answer with our bearer token, if it quotes it (a registry or a gateway echoing the
        request's headers), shown as ***: the errors, the attempt log and the log lines made from
        it are read by people who may not hold ODAL_REGISTRY_TOKEN (a Viewer on the passport's
        story and the registration's page)."""
        if len(self.token) < SHORTEST_SECRET:  # (as odal.core.redact: a shorter one would garble the text)
            return body
        for spelling in dict.fromkeys((self.token, self.token.replace("/", "\\/"))):
            body = body.replace(spelling.encode(), HIDDEN.encode())
        return body

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def _send(self, method: str, path: str, *, deadline: float | None = None, **kwargs) -> Answer:
        """One request and its answer, within the timeout, all of it (and before `deadline`, a
        monotonic time, when one is given: a request made near it gets only what is left): a
        registry trickling its headers a byte at a time fails the attempt, as a stalled one does,
        instead of holding its drain's pass for ever."""
        now = time.monotonic()
        timeout = self.timeout if deadline is None else max(0.001, min(self.timeout, deadline - now))
        status = None
        try:
            with (
                within(now + timeout),
                self._client().stream(
                    method, path, follow_redirects=False, timeout=timeout, **kwargs
                ) as response,
            ):
                status = response.status_code
                body = self._without_token(read_answer(response, ANSWER_CAP, now + timeout))
        except NOT_SENT_ERRORS as exc:
            if isinstance(exc, httpx.TimeoutException):
                raise Retryable(f"registry timed out after {round(timeout, 3):g}s connecting") from None
            raise Retryable(f"registry unreachable: {error_text(exc)}") from None
        except httpx.TimeoutException:
            raise OutcomeUnknown(
                f"registry timed out after {round(timeout, 3):g}s; the request may have reached it"
            ) from None
        except httpx.HTTPError as exc:
            if status:
                raise OutcomeUnknown(
                    f"registry connection broke while reading the body of an HTTP {status} answer: "
                    f"{error_text(exc)}"
                ) from None
            raise OutcomeUnknown(
                f"registry connection broke after the request was sent: {error_text(exc)}"
            ) from None
        if 300 <= status < 400:
            location = response.headers.get("location")
            raise Redirected(f"registry answered {redirect_text(response.status_code, location)}")
        return Answer(status, response.headers.get("content-type", ""), body, response.headers)

    @staticmethod
    def _json(answer: Answer, what: str) -> dict:
        """The answer's JSON object, or Retryable saying why there is none."""
        said = PROTOCOL_ERROR + answer.said(what)
        media_type = answer.content_type.partition(";")[0].strip().lower()
        if media_type != "application/json" and not (
            media_type.startswith("application/") and media_type.endswith("+json")
        ):
            raise Retryable(f"{said} with content type {storable(media_type, 100) or '(none)'}, not JSON")
        if len(answer.body) > ANSWER_CAP:
            raise Retryable(f"{said} with a body over {ANSWER_CAP:,} bytes")
        try:
            body = json.loads(answer.body.decode())
        except UnicodeDecodeError:
            raise Retryable(f"{said} with malformed JSON (not UTF-8): {excerpt(answer.body)}") from None
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            raise Retryable(f"{said} with malformed JSON: {excerpt(answer.body)}") from None
        if not isinstance(body, dict):
            raise Retryable(f"{said} with JSON that is not an object: {excerpt(answer.body)}")
        return body

    # -- the drain's calls --------------------------------------------------------------------

    def register(self, registration) -> Accepted | Duplicate | Rejected:
        passport = registration.passport
        body = {
            "upi": passport.upi,
            "operatorId": passport.operator_id,
            "facilityIds": [passport.facility_id] if passport.facility_id else [],
            "commodityCode": passport.commodity_code,
            "dppEndpoint": f"{settings.ODAL_PUBLIC_URL}/vault/api/v1/dpp/{passport.pk}",
        }
        answer = self._send(
            "POST", "/dpp-registration-requests", json=body, headers={"Idempotency-Key": str(registration.pk)}
        )
        said = answer.said("register")
        if answer.status_code in (200, 201, 202):
            try:
                return Accepted(_id(self._json(answer, "register"), "requestId", said))
            except Retryable as exc:
                # Not the registry's answer (a proxy's page, a body cut short, another shape), or
                # its answer with an id odal cannot keep: either way it may hold the request.
                raise OutcomeUnknown(str(exc)) from None
        error = answer.own_error()
        if error is not None and answer.status_code == 409 and error["code"] == "DUPLICATE_UPI":
            try:
                return Duplicate(_id(error, "requestId", said + " DUPLICATE_UPI"))
            except Retryable as exc:
                raise OutcomeUnknown(str(exc)) from None
        if error is not None and answer.status_code == 422:
            return Rejected(_errors(error))
        raise answer.refusal("register")

    def check(self, request_id: str) -> CheckAnswer:
        answer = self._send("GET", f"/dpp-registration-requests/{quote(request_id, safe='')}")
        if answer.status_code == 404 and answer.own_error() is not None:
            raise UnknownRequest(
                f"{answer.said('check')}: the registry does not know request {_shown(request_id)}"
            )
        if answer.status_code != 200:
            raise answer.refusal("check")
        try:
            payload = self._json(answer, "check")
        except Retryable as exc:
            raise OutcomeUnknown(str(exc)) from None  # not the registry's answer
        if "status" not in payload:
            raise OutcomeUnknown(
                f"{PROTOCOL_ERROR}{answer.said('check')} with JSON of another shape (no status): "
                f"{excerpt(answer.body)}"
            )
        status = payload.get("status")
        if status not in ("checking", "registered", "rejected", "received"):
            raise Retryable(
                f"{PROTOCOL_ERROR}{answer.said('check')} with an unknown status: {_shown(status)}"
            )
        if status == "registered":
            return CheckAnswer(
                "registered",
                registration_id=_id(payload, "registrationId", answer.said("check")),
                deactivated=payload.get("deactivated") is True,
            )
        if status == "rejected":
            return CheckAnswer("rejected", errors=_errors(payload))
        return CheckAnswer("checking")

    def deactivate(self, registration_id: str) -> str:
        answer = self._send("POST", f"/registrations/{quote(registration_id, safe='')}/deactivate")
        if answer.status_code == 204:
            return "deactivated"
        if answer.status_code == 200:
            if not answer.body.strip():
                return "deactivated"
            try:
                self._json(answer, "deactivate")
            except Retryable as exc:
                raise OutcomeUnknown(str(exc)) from None  # not the registry's answer
            return "deactivated"
        if answer.status_code == 404 and answer.own_error() is not None:
            return "already gone"
        if 200 <= answer.status_code < 300:
            raise OutcomeUnknown(
                f"{PROTOCOL_ERROR}{answer.said('deactivate')} (the protocol's are 200 and 204): "
                f"{excerpt(answer.body)}".rstrip(": ")
            )
        raise answer.refusal("deactivate")

    # -- abandon's question ---------------------------------------------------------------------

    def find_submission(self, upi: str) -> Found | Ambiguous | NotFound | Unsupported:
        """Read the whole task list. Found/Ambiguous if requests for the UPI are held, under any
        spelling of it (canonical forms are compared, odal.core.upi; rejected requests do not count);
        NotFound(exhaustive=True) only if every page was read, none names the UPI and none is
        still `received` (unread by the registry, its upi possibly unknown). A list that does not
        end is RegistryUnreadable, never an answer: a cursor it gave before, more than
        MAX_TASK_PAGES pages, or the lookup's deadline (ODAL_REGISTRY_LOOKUP_SECONDS) passed."""
        seconds = self.lookup_seconds or settings.ODAL_REGISTRY_LOOKUP_SECONDS
        deadline = time.monotonic() + seconds
        wanted = upi_key(upi)
        held: list[str] = []
        unread = 0
        cursor = None
        cursors = set()
        for page in range(MAX_TASK_PAGES):
            params = {"limit": 200, **({"cursor": cursor} if cursor else {})}
            what = f"task list page {page + 1}"
            if time.monotonic() >= deadline:
                raise RegistryUnreadable(_overdue(seconds, page))
            try:
                answer = self._send("GET", "/dpp-registration-requests", params=params, deadline=deadline)
                if answer.status_code in UNSEARCHABLE_STATUSES and page == 0:
                    # (whatever the body: a registry without the route, or a front that has none)
                    return Unsupported(
                        f"the registry's task list cannot be searched (HTTP {answer.status_code})"
                    )
                if answer.status_code != 200:
                    raise answer.refusal(what)
                body = self._json(answer, what)
                items, cursor = body.get("items"), body.get("nextCursor")
                if not isinstance(items, list) or not isinstance(cursor, str | None):
                    raise Retryable(f"{PROTOCOL_ERROR}{what} is not what the protocol says: {_shape(body)}")
                if cursor and len(cursor) > MAX_CURSOR:
                    raise Retryable(
                        f"{PROTOCOL_ERROR}{what} answered a nextCursor of {len(cursor):,} characters; "
                        f"at most {MAX_CURSOR:,} are sent back"
                    )
                for item in items:
                    if not _task_item(item):
                        raise Retryable(f"{PROTOCOL_ERROR}{what} holds a malformed item: {excerpt(item)}")
                    if item.get("status") == "received":
                        unread += 1
                    elif upi_key(item["upi"]) == wanted and item.get("status") != "rejected":
                        held.append(_id(item, "requestId", f"{what} holds an item"))
            except Retryable as exc:
                if time.monotonic() >= deadline - 0.05:  # cut short by the deadline
                    raise RegistryUnreadable(_overdue(seconds, page)) from None
                raise RegistryUnreadable(str(exc)) from None
            if not cursor:
                break
            if cursor in cursors:
                raise RegistryUnreadable(
                    f"{PROTOCOL_ERROR}the task list repeats cursor {_shown(cursor)} (on {what}): "
                    "read on, it would never end"
                )
            cursors.add(cursor)
        else:
            raise RegistryUnreadable(
                f"the task list has more than {MAX_TASK_PAGES} pages; it was not read to its end"
            )
        if len(held) == 1:
            return Found(held[0])
        if held:
            return Ambiguous(held)
        if unread:
            return NotFound(exhaustive=False, why=f"{unread} task(s) not yet read by the registry")
        return NotFound(exhaustive=True)


class NoneRegistry:
    """ODAL_REGISTRY_ADAPTER=none: this node queues no registry work."""

    name = "none"

    def register(self, registration):
        raise NoRegistry()

    def check(self, request_id):
        raise NoRegistry()

    def deactivate(self, registration_id):
        raise NoRegistry()

    def find_submission(self, upi):
        raise NoRegistry()

    def close(self) -> None:
        pass


def get_adapter(*, lookup_seconds: float | None = None):
    """The configured adapter; `lookup_seconds` shortens find_submission's deadline (the admin's
    abandon gives each lookup what is left of its own)."""
    if settings.ODAL_REGISTRY_ADAPTER == "none":
        return NoneRegistry()
    return HttpRegistry(
        base_url=settings.ODAL_REGISTRY_URL,
        token=settings.ODAL_REGISTRY_TOKEN,
        timeout=settings.ODAL_REGISTRY_TIMEOUT_SECONDS,
        lookup_seconds=lookup_seconds,
        connections=settings.ODAL_REGISTRY_CONCURRENCY,
    )


def _errors(payload: dict) -> str:
    """The registry's reasons for a rejection, as storable text."""
    errors = payload.get("errors") or []
    code = storable(payload.get("code") or "REJECTED", 100)
    if isinstance(errors, list) and errors:
        return storable(
            f"{code}: "
            + "; ".join(storable(e.get("message", e) if isinstance(e, dict) else e, 500) for e in errors)
        )
    return code


def _id(payload: dict, name: str, said: str) -> str:
    """payload[name] as an id odal can store and put in a URL path, or Retryable (a protocol
    error) naming it."""
    value = payload.get(name)
    if isinstance(value, str) and len(value) > MAX_ID:
        raise Retryable(
            f"{PROTOCOL_ERROR}{said} with a {name} of {len(value):,} characters; at most {MAX_ID} are kept"
        )
    # isprintable(): no NUL, no lone surrogate, no control character, no line break
    if isinstance(value, str) and value and value.isprintable():
        return value
    raise Retryable(f"{PROTOCOL_ERROR}{said} with an unusable {name}: {_shown(value)}")


def _overdue(seconds: float, pages: int) -> str:
    return (
        f"the task list was not read to its end within {seconds:g}s (ODAL_REGISTRY_LOOKUP_SECONDS; "
        f"{pages} page(s) read)"
    )


def _shown(value) -> str:
    """A JSON value as an error may quote it: strings quoted and escaped (so a NUL reads \\x00),
    anything else by its type."""
    return excerpt(repr(value), 100) if isinstance(value, str) else f"a JSON {_json_type(value)}"


def _json_type(value) -> str:
    types = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else types.get(type(value), type(value).__name__)


def _shape(body: dict) -> str:
    return f"items is {_shown(body.get('items'))}, nextCursor is {_shown(body.get('nextCursor'))}"


def _task_item(item) -> bool:
    """A task-list item as the protocol has it: a known status, and a upi string (null only
    while received). Anything else and the list cannot show what the registry holds."""
    if not isinstance(item, dict) or item.get("status") not in TASK_STATUSES:
        return False
    return isinstance(item.get("upi"), str) or (item["status"] == "received" and item.get("upi") is None)
