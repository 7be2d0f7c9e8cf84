"""Calling a consumer: a webhook over HTTP (Standard Webhooks) or a Python callable.

Either way the answer is an Outcome; nothing here touches the delivery row.
"""

import asyncio
import base64
import functools
import hmac
import ipaddress
import json
import socket
import ssl
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlparse

import httpx
from django.conf import settings
from django.utils.module_loading import import_string
from standardwebhooks import Webhook

from odal.core import rules
from odal.core.addresses import why_not_public
from odal.core.errors import Refused
from odal.core.redact import HIDDEN, redacted_urls_in, without_secrets_of
from odal.core.text import error_text, excerpt, storable
from odal.work.http import redirect_text
from outbox.webhook_client import IN_FLIGHT, Answer, HttpError, WebhookClient

USER_AGENT = "odal-webhooks/1"
ANSWER_CAP = 64 * 1024  # of a webhook's answer only an excerpt is kept: read no more than this
MAX_CONTENT_TYPE = 200  # DeliveryAttempt.content_type


@dataclass
class Outcome:
    ok: bool
    error: str = ""
    http_status: int | None = None
    duration_ms: int = 0
    # What the consumer answered, storable and bounded (see answer_excerpt): for the attempt log.
    answer: str = ""
    content_type: str = ""


_BODY = json.JSONEncoder(separators=(",", ":"), sort_keys=True)  # (made once: json.dumps makes one a call)


def webhook_body(event) -> str:
    return _BODY.encode(
        {"type": event.type, "timestamp": event.created_at.isoformat(), "data": event.payload}
    )


def signing_secrets(consumer, *, now: datetime | None = None) -> list[str]:
    """The secrets a request to `consumer` is signed with: its own, and the one it replaced
    while that one's grace runs (outbox.service.rotate_secret)."""
    now = now or datetime.now(UTC)
    found = [consumer.secret]
    expires = getattr(consumer, "previous_secret_expires_at", None)
    if getattr(consumer, "previous_secret", "") and expires is not None and expires > now:
        found.append(consumer.previous_secret)
    return found


def webhook_headers(consumer, delivery_id, body: str | bytes, now: datetime | None = None) -> dict[str, str]:
    """Standard Webhooks headers: the delivery id (stable across retries and resends: the
    consumer's idempotency key), Unix seconds, and v1,<base64 HMAC-SHA256 of
    "{id}.{timestamp}.{body}"> for each signing secret, space-separated (during a rotation's
    grace, both the new and the old secret sign: a consumer checking either accepts it)."""
    now = now or datetime.now(UTC)
    msg_id, timestamp = str(delivery_id), str(int(now.timestamp()))
    signed = f"{msg_id}.{timestamp}.".encode() + (body.encode() if isinstance(body, str) else body)
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": msg_id,
        "webhook-timestamp": timestamp,
        "webhook-signature": " ".join(
            "v1," + base64.b64encode(hmac.digest(_key(secret), signed, "sha256")).decode()
            for secret in signing_secrets(consumer, now=now)
        ),
    }


@functools.lru_cache(maxsize=256)
def _key(secret: str) -> bytes:
    """A secret's HMAC key, decoded once (not once a request) as Standard Webhooks decodes it:
    base64 after the whsec_ prefix. (standardwebhooks' Webhook.sign cost a sweep a tenth of a
    webhook's CPU: an object, the key decoded and the body encoded again, per request; the
    tests check what this signs with its Webhook.verify.)"""
    return Webhook(secret)._whsecret


def answer_excerpt(body) -> str:
    """What the attempt log keeps of an answer's body (or of a callable's return value)."""
    return storable(body)


def answer_content_type(answer: Answer) -> str:
    """The answer's Content-Type, storable and bounded; "" before any answer arrived."""
    return storable(answer.header("content-type"), MAX_CONTENT_TYPE)


def call_webhook(consumer, delivery_id, event, client: WebhookClient) -> Outcome:
    """Send the webhook from this thread, and wait for its outcome (see send_webhook)."""
    if not isinstance(client, WebhookClient):
        # Any other client would connect wherever its own lookup of the host says.
        raise TypeError("call_webhook needs a client made by webhook_client(): its connections are pinned")
    return client.send(send_webhook(consumer, delivery_id, event, client))


async def send_webhook(consumer, delivery_id, event, client: WebhookClient, may_start=None) -> Outcome | None:
    """POST the event to the consumer, on `client`'s loop: connected to the address checked for
    its host, the whole request (the lookup of its host too) held to the consumer's
    timeoutSeconds, no more than ANSWER_CAP bytes of the answer read, no redirect followed.
    None if `may_start()`, asked once the host is looked up, says no (not started)."""
    try:
        request = _request_of(consumer.url)
    except Refused as exc:
        return Outcome(False, storable(f"not called: {exc.detail}"))
    started = time.monotonic()
    answer = Answer()  # filled as it arrives: a timeout or a reset still leaves what was read
    signatures: tuple[str, ...] = ()
    try:
        async with asyncio.timeout(consumer.timeout_seconds):
            # Checked again at delivery time, and connected to at the address checked: a name may
            # resolve inside now, or answer a second lookup otherwise than the first (DNS rebinding).
            try:
                target = await _pinned_target(request.name, client)
            except Refused as exc:
                return Outcome(False, storable(f"not called: {exc.detail}"))
            if may_start is not None and not may_start():
                return None  # (the claim's hold ran out, or a stop or a pause came, during the lookup)
            body = webhook_body(event).encode()
            headers = webhook_headers(consumer, delivery_id, body)
            signatures = _signatures_in(headers)
            await client.request(
                https=request.https, name=target.name, address=str(target.address), port=request.port,
                data=request.head + _headers_text(headers, body) + body, answer=answer, cap=ANSWER_CAP,
            )  # fmt: skip
    except TimeoutError:
        error = _reading(f"timed out after {consumer.timeout_seconds}s", answer.status)
        return _answered(False, error, started, answer, signatures)
    except HttpError as exc:
        error = _reading(f"connection error: {error_text(exc)}", answer.status)
        return _answered(False, error, started, answer, signatures)
    status = answer.status
    if 200 <= status < 300:
        return _answered(True, "", started, answer, signatures)
    if 300 <= status < 400:
        error = redirect_text(status, answer.header("location"))
    else:
        error = f"HTTP {status}: {excerpt(answer.body)}".rstrip(": ")
    return _answered(False, error, started, answer, signatures)


@dataclass(frozen=True)
class _Request:
    """What every request to one webhook URL shares: its host, port, and the start of its head."""

    https: bool
    name: str  # the host, as resolved (a non-ASCII name in its xn-- form)
    port: int
    head: bytes  # b"POST <path and query> HTTP/1.1\r\nhost: <netloc>\r\n"


@functools.lru_cache(maxsize=1024)
def _request_of(url: str) -> _Request:
    """A webhook URL read once (a refused one is not kept: see _webhook_url). Credentials in its
    userinfo are sent as HTTP Basic authorization, as httpx sent them (a consumer may check them)."""
    parsed = _webhook_url(url)
    https = parsed.scheme == "https"
    head = b"POST " + parsed.raw_path + b" HTTP/1.1\r\nhost: " + parsed.netloc + b"\r\n"
    if parsed.userinfo:
        credentials = f"{parsed.username}:{parsed.password}".encode()
        head += b"authorization: Basic " + base64.b64encode(credentials) + b"\r\n"
    return _Request(https, parsed.raw_host.decode("ascii"), parsed.port or (443 if https else 80), head)


def _headers_text(headers: dict[str, str], body: bytes) -> bytes:
    """The rest of the head: Standard Webhooks' headers, identity (nothing to inflate), the length."""
    lines = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    return f"{lines}accept-encoding: identity\r\ncontent-length: {len(body)}\r\n\r\n".encode("ascii")


def _signatures_in(headers: dict[str, str]) -> tuple[str, ...]:
    """The signatures a request carries (the base64 of each "v1,<base64>"), as sent and as a JSON
    encoder that escapes "/" writes them: what an answer echoing the request must not keep."""
    sent = [part.partition(",")[2] for part in headers["webhook-signature"].split()]
    return tuple(dict.fromkeys(form for sig in sent if sig for form in (sig, sig.replace("/", "\\/"))))


def without_signatures(text: str, signatures: tuple[str, ...]) -> str:
    """`text` (an answer, an error quoting it) with each signature the request carried shown as
    ***: a consumer echoing its request (an echo service, a debugging endpoint) would otherwise
    hand whoever reads the attempt log a signed request to replay within the timestamp's
    tolerance."""
    for signature in signatures:
        text = text.replace(signature, HIDDEN)
    return text


def _answered(
    ok: bool, error: str, started: float, answer: Answer, signatures: tuple[str, ...] = ()
) -> Outcome:
    return Outcome(
        ok,
        without_signatures(error, signatures),
        http_status=answer.status,
        duration_ms=_since(started),
        answer=without_signatures(answer_excerpt(answer.body), signatures),
        content_type=answer_content_type(answer),
    )


def _reading(error: str, status: int | None) -> str:
    return f"{error} while reading the body of an HTTP {status} answer" if status else error


def call_python(consumer, delivery_id, event) -> Outcome:
    started = time.monotonic()
    try:
        func = python_callable(consumer.target)  # the allow-list as this process has it
    except Refused as exc:
        return Outcome(False, storable(f"not called: {exc.detail}"))
    try:
        returned = func(event, delivery_id)
    except Exception as exc:  # whatever the consumer raises fails the attempt
        return Outcome(False, error_text(exc), duration_ms=_since(started))
    answer = "" if returned is None else answer_excerpt(returned)
    return Outcome(True, duration_ms=_since(started), answer=answer)


def call(consumer, delivery_id, event, client: WebhookClient | None) -> Outcome:
    """Call the consumer from this thread, and wait for its outcome (redacted)."""
    if consumer.kind == "python":
        return redacted(consumer, call_python(consumer, delivery_id, event))
    return redacted(consumer, call_webhook(consumer, delivery_id, event, client))


async def deliver_webhook(
    consumer, delivery_id, event, client: WebhookClient, may_start=None
) -> Outcome | None:
    """call() for a webhook consumer, on the client's loop (the sweep's attempts); None if
    `may_start` said no once the host was looked up (see send_webhook)."""
    outcome = await send_webhook(consumer, delivery_id, event, client, may_start)
    return None if outcome is None else redacted(consumer, outcome)


def redacted(consumer, outcome: Outcome) -> Outcome:
    """The error an attempt ends with goes to the attempt log, the delivery's lastError, the
    process log and an automatic pause's reason, all read by people who may not see the
    webhook's credentials: any URL in it (an HTTP library's message, a redirect's Location) and
    any credential of the webhook's URL that it or the answer quotes are redacted here, once for
    all of them."""
    if consumer.kind != "python":
        outcome.answer = without_secrets_of(consumer.url, outcome.answer)
    outcome.error = without_secrets_of(consumer.url, redacted_urls_in(outcome.error))
    return outcome


def _since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


# -- checking a consumer's target: when it is configured, and before each request ------------------


@dataclass(frozen=True)
class Target:
    """Where a webhook request connects: `address`, the one checked for its host `name`. The
    request itself goes to the consumer's URL unchanged, so its Host header, its TLS server name
    (SNI, and the name the certificate is verified against) and the key its connection is pooled
    under are all the name; only the connection is made to the address (see
    outbox/webhook_client.py, `_connect`)."""

    name: str
    address: ipaddress.IPv4Address | ipaddress.IPv6Address


# A webhook host's addresses are looked up again after this long: a sweep sending hundreds of
# requests a second to one host resolves it about once in that time, not once per request, and a
# name that moves (or starts to resolve inside, refused from then on) is followed within it.
DNS_CACHE_SECONDS = 30.0
DNS_CACHE_HOSTS = 1024  # names a client remembers; the one looked up longest ago goes first


class Answers:
    """A webhook client's lookups: each host's addresses, reused for DNS_CACHE_SECONDS. Only
    answers are kept (a name that did not resolve is asked again next time), and a kept answer is
    checked again at every use: what is connected to is what was checked, as without it."""

    def __init__(self, seconds: float = DNS_CACHE_SECONDS, size: int = DNS_CACHE_HOSTS, clock=time.monotonic):
        self.seconds, self.size, self.clock = seconds, max(1, size), clock
        self._kept: dict[str, tuple[float, list]] = {}  # host -> (until, addresses), oldest first
        self._lock = threading.Lock()

    def kept(self, host: str) -> list | None:
        """The addresses of `host` looked up less than `seconds` ago, or None."""
        now = self.clock()
        with self._lock:
            until, addresses = self._kept.get(host, (now, None))
        return addresses if addresses is not None and now < until else None

    def addresses(self, host: str) -> list:
        addresses = self.kept(host)
        if addresses is not None:
            return addresses
        now = self.clock()
        addresses = _addresses(host)
        with self._lock:
            self._kept.pop(host, None)
            while len(self._kept) >= self.size:
                del self._kept[next(iter(self._kept))]
            self._kept[host] = (now + self.seconds, addresses)
        return addresses


# How long storing a webhook URL (the API, the admin, the command line) waits for its host's
# lookup: a resolver that hangs must not hold a web request (nor a gunicorn worker) for minutes.
URL_LOOKUP_SECONDS = 5.0


def check_webhook_url(url: str) -> str:
    """http(s) only; in production (unless ODAL_ALLOW_PRIVATE_WEBHOOKS) no host that resolves to
    a loopback, private, link-local, multicast or otherwise not public address, nor to an IPv6
    address that carries one (NAT64, 6to4...: odal.core.addresses). The host's lookup gets
    URL_LOOKUP_SECONDS; past them, 503 host_lookup_timeout, and nothing is stored."""
    parsed = _webhook_url(url)
    if not settings.ODAL_ALLOW_PRIVATE_WEBHOOKS:
        _checked_addresses(parsed.raw_host.decode("ascii"), _addresses_within)
    return url


_url_lookups: dict[str, Future] = {}  # host -> its lookup under way (for check_webhook_url)
_url_lookups_lock = threading.Lock()


def _addresses_within(host: str) -> list:
    """_addresses(host), waited for at most URL_LOOKUP_SECONDS: on a daemon thread of its own, so
    that a lookup that hangs holds that thread (one per host at a time: a request for a host
    already being looked up waits for that lookup), not the request, nor the process's exit."""
    with _url_lookups_lock:
        pending = _url_lookups.get(host)
        if pending is None:
            pending = _url_lookups[host] = Future()
            threading.Thread(
                target=_look_up, args=(host, pending), name="odal-url-lookup", daemon=True
            ).start()
    try:
        return pending.result(timeout=URL_LOOKUP_SECONDS)
    except TimeoutError:
        raise Refused(
            f"The webhook host {host} did not resolve within {URL_LOOKUP_SECONDS:g} s (its name servers do "
            "not answer); nothing was saved. Try again later, or check the host's DNS.",
            code="host_lookup_timeout",
            status=503,
        ) from None


def _look_up(host: str, pending: Future) -> None:
    try:
        pending.set_result(_addresses(host))
    except BaseException as exc:  # (Refused "does not resolve", or anything: the waiters get it)
        pending.set_exception(exc)
    finally:
        with _url_lookups_lock:
            if _url_lookups.get(host) is pending:
                del _url_lookups[host]


def _webhook_url(url: str) -> httpx.URL:
    try:
        parsed = urlparse(url)
        hostname = parsed.hostname
    except ValueError as exc:  # ("http://[::1/": an unclosed bracket; a netloc NFKC makes another)
        raise Refused(f"A webhook URL must be a valid URL: {exc}.", code="invalid_url", status=422) from None
    if parsed.scheme not in ("http", "https") or not hostname:
        raise Refused(
            "A webhook URL must be an http:// or https:// URL with a host.", code="invalid_url", status=422
        )
    if len(url) > 2000:
        raise Refused("A webhook URL must be at most 2000 characters.", code="invalid_url", status=422)
    try:
        port = parsed.port
    except ValueError:  # (httpx reads 70000 as 70000, and the connection would go to port 4464)
        port = 0
    if port == 0:
        raise Refused("A webhook URL's port must be from 1 to 65535.", code="invalid_url", status=422)
    try:
        # As httpx reads it: its host (a non-ASCII name in its xn-- form) is the one resolved.
        return httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise Refused(f"A webhook URL must be a valid URL: {exc}.", code="invalid_url", status=422) from None


def _checked_addresses(host: str, lookup=None) -> list:
    """The addresses of `host` (as `lookup` gives them: a client's Answers, else a fresh lookup), in the
    resolver's order; in production (unless ODAL_ALLOW_PRIVATE_WEBHOOKS) refused if any of them
    is not a public unicast address (odal.core.addresses: the one rule, asked when a URL is stored and
    when connecting)."""
    addresses = (lookup or _addresses)(host)
    if not settings.ODAL_ALLOW_PRIVATE_WEBHOOKS:
        for address in addresses:
            problem = why_not_public(address)
            if problem is not None:
                raise Refused(
                    f"{host} resolves to {address}, {problem}; webhooks may only "
                    "reach public hosts here (set ODAL_ALLOW_PRIVATE_WEBHOOKS=true to allow it).",
                    code="private_webhook_target",
                    status=422,
                )
    return addresses


def _addresses(host: str) -> list:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):  # (a name with an empty or over-long label: a..b, 64 a's)
        infos = []
    if not infos:
        raise Refused(f"The webhook host {host} does not resolve.", code="invalid_url", status=422)
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))


# -- the client webhooks are sent with (outbox.webhook_client) --------------------------------------


async def _pinned_target(name: str, client: WebhookClient) -> Target:
    """Resolve the webhook's host once (or take the client's lookup of it, at most
    DNS_CACHE_SECONDS old), check every address it has (see check_webhook_url), and pin the
    first: the request connects to exactly that address. Resolving again when connecting could
    answer otherwise (DNS rebinding: a public address for the check, an internal one for the
    connection). Pinned always, private targets allowed or not: one way of connecting. A lookup
    not kept is made on a thread of its own (client.lookup: the loop carries every request in
    flight); what it answered is checked at every use."""
    addresses = client.answers.kept(name)
    if addresses is None:
        addresses = await client.lookup(name, client.answers.addresses)
    return Target(name, _checked_addresses(name, lambda _: addresses)[0])


def webhook_client(
    *, verify: ssl.SSLContext | bool = True, network=None, in_flight: int = IN_FLIGHT
) -> WebhookClient:
    """The only client call_webhook sends with: it connects to a webhook's host only at the
    address checked for it, never through a proxy, and follows no redirect. Connections are
    pooled by scheme, host name, port and address (a kept-alive connection, https included,
    serves later requests to its own name only). `verify` as ssl's (True: the system's
    authorities; an SSLContext of a test's); `network` for tests (outbox.webhook_client.open_stream's
    signature). Close it: it has a thread."""
    return WebhookClient(verify=verify, network=network, in_flight=in_flight, answers=Answers())


@functools.lru_cache(maxsize=1024)
def allowed_python_target(target: str, allowed: tuple[str, ...]) -> str:
    """`target` checked as a dotted path and against the allow-list `allowed`; a refusal is raised
    (and not kept: only answers that passed are, per target and list, since a sweep asks for
    every attempt)."""
    try:
        target = rules.python_target(target)
    except ValueError as exc:
        raise Refused(f"The target {rules.shown(target)} {exc}.", code="invalid_target", status=422) from None
    if not rules.python_target_allowed(target, allowed):
        raise Refused(
            f"The target {target} is not one this node allows (ODAL_PYTHON_CONSUMERS: {', '.join(allowed)}).",
            code="invalid_target",
            status=422,
        )
    return target


def python_callable(target: str):
    """The callable a Python consumer's `target` names, checked, the allow-list first: nothing
    outside ODAL_PYTHON_CONSUMERS is imported (an import runs the module's code). Under an entry
    `prefix.*` the callable must also be defined under the prefix: `outbox.receiver.Webhook` is a
    class imported there from elsewhere, and the allow-list names modules, not what they import.
    Refused (422 invalid_target) with a sentence for a person, whatever the import raises."""
    allowed = settings.ODAL_PYTHON_CONSUMERS
    target = allowed_python_target(target, allowed)
    try:
        func = import_string(target)
    except Exception as exc:  # ImportError, or whatever importing the module raised
        raise Refused(
            f"{target!r} cannot be imported: {error_text(exc)}.", code="invalid_target", status=422
        ) from None
    if not callable(func):
        raise Refused(f"{target!r} is not callable.", code="invalid_target", status=422)
    module = getattr(func, "__module__", None) or "?"
    if target not in allowed and not rules.python_module_allowed(module, allowed):
        raise Refused(
            f"{target!r} is not defined under an allowed prefix (it comes from {module}); name it in "
            "ODAL_PYTHON_CONSUMERS itself to allow it.",
            code="invalid_target",
            status=422,
        )
    return func


def check_python_target(target: str) -> str:
    python_callable(target)
    return target
