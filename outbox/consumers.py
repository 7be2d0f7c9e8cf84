"""Calling a consumer: a webhook over HTTP (Standard Webhooks) or a Python callable.

Either way the answer is an Outcome; nothing here touches the delivery row.
"""

import ipaddress
import json
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlparse

import httpx
from django.conf import settings
from django.utils.module_loading import import_string
from standardwebhooks import Webhook

from odal.errors import Refused

USER_AGENT = "odal-webhooks/1"
BODY_EXCERPT = 200


@dataclass
class Outcome:
    ok: bool
    error: str = ""
    http_status: int | None = None
    duration_ms: int = 0


def webhook_body(event) -> str:
    return json.dumps(
        {"type": event.type, "timestamp": event.created_at.isoformat(), "data": event.payload},
        separators=(",", ":"),
        sort_keys=True,
    )


def webhook_headers(consumer, delivery_id, body: str, now: datetime | None = None) -> dict[str, str]:
    """Standard Webhooks headers: the delivery id (stable across retries: the consumer's
    idempotency key), Unix seconds, and v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">."""
    now = now or datetime.now(UTC)
    msg_id = str(delivery_id)
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(consumer.secret).sign(msg_id, now, body),
    }


def excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= BODY_EXCERPT else text[:BODY_EXCERPT] + "…"


def call_webhook(consumer, delivery_id, event, client: httpx.Client) -> Outcome:
    if not settings.ODAL_ALLOW_PRIVATE_WEBHOOKS:
        # Checked again at delivery time: a name may resolve inside now (DNS rebinding).
        try:
            check_webhook_url(consumer.url)
        except Refused as exc:
            return Outcome(False, f"not called: {exc.detail}")
    body = webhook_body(event)
    headers = webhook_headers(consumer, delivery_id, body)
    started = time.monotonic()
    try:
        response = client.post(
            consumer.url, content=body.encode(), headers=headers, timeout=consumer.timeout_seconds
        )
    except httpx.TimeoutException:
        return Outcome(False, f"timed out after {consumer.timeout_seconds}s", duration_ms=_since(started))
    except httpx.HTTPError as exc:
        return Outcome(
            False, f"connection error: {type(exc).__name__}: {exc}"[:500], duration_ms=_since(started)
        )
    if 200 <= response.status_code < 300:
        return Outcome(True, http_status=response.status_code, duration_ms=_since(started))
    return Outcome(
        False,
        f"HTTP {response.status_code}: {excerpt(response.text)}".rstrip(": "),
        http_status=response.status_code,
        duration_ms=_since(started),
    )


def call_python(consumer, delivery_id, event) -> Outcome:
    started = time.monotonic()
    try:
        import_string(consumer.target)(event, delivery_id)
    except Exception as exc:  # whatever the consumer raises fails the attempt
        return Outcome(False, f"{type(exc).__name__}: {exc}"[:500], duration_ms=_since(started))
    return Outcome(True, duration_ms=_since(started))


def call(consumer, delivery_id, event, client: httpx.Client) -> Outcome:
    if consumer.kind == "python":
        return call_python(consumer, delivery_id, event)
    return call_webhook(consumer, delivery_id, event, client)


def _since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


# -- checking a consumer's target when it is configured -------------------------------------------


def check_webhook_url(url: str) -> str:
    """http(s) only; in production (unless ODAL_ALLOW_PRIVATE_WEBHOOKS) no host that resolves to
    a loopback, private, link-local or otherwise internal address."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise Refused(
            "A webhook URL must be an http:// or https:// URL with a host.", code="invalid_url", status=422
        )
    if len(url) > 2000:
        raise Refused("A webhook URL must be at most 2000 characters.", code="invalid_url", status=422)
    if not settings.ODAL_ALLOW_PRIVATE_WEBHOOKS:
        for address in _addresses(parsed.hostname):
            if not address.is_global:
                raise Refused(
                    f"{parsed.hostname} resolves to {address}, an internal address; webhooks may only "
                    "reach public hosts here (set ODAL_ALLOW_PRIVATE_WEBHOOKS=true to allow it).",
                    code="private_webhook_target",
                    status=422,
                )
    return url


def _addresses(host: str) -> list:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        raise Refused(f"The webhook host {host} does not resolve.", code="invalid_url", status=422) from None
    return [ipaddress.ip_address(info[4][0]) for info in infos]


def check_python_target(target: str) -> str:
    try:
        func = import_string(target)
    except ImportError as exc:
        raise Refused(f"{target!r} cannot be imported: {exc}.", code="invalid_target", status=422) from None
    if not callable(func):
        raise Refused(f"{target!r} is not callable.", code="invalid_target", status=422)
    return target
