"""HTTP with a deadline for the whole request: what the registry adapter sends with (the sweep's
webhook client, outbox/webhook_client.py, holds its own deadline over the whole request).
httpx's timeouts hold for each read, write or connect; these hold for the request, so a peer
trickling its answer a byte at a time cannot hold a worker's thread for ever."""

import time
from contextlib import contextmanager
from contextvars import ContextVar

import httpcore
import httpx

from odal.core.text import storable


def read_answer(response: httpx.Response, cap: int, deadline: float, into: bytearray | None = None) -> bytes:
    """The answer's body, read until the monotonic `deadline`, and no more than `cap` bytes of
    it (one chunk past the cap at most; the caller closes the response on the rest). `into`, if
    given, gets the bytes as they arrive: what was read before a timeout or a reset.

    httpx's timeout holds for each read, so a body trickled a byte at a time would never time
    out: past the deadline this raises httpx.ReadTimeout, as a stalled read does. (A read that
    stalls just before the deadline still waits out its own timeout: at worst an answer takes
    about twice the timeout, never forever.) Raw bytes, not decoded: a compressed body is not
    inflated (requests ask for identity), so the cap holds for what is kept in memory."""
    body = bytearray() if into is None else into
    for chunk in response.iter_raw():
        body += chunk
        if len(body) > cap:
            break
        if time.monotonic() > deadline:
            raise httpx.ReadTimeout("the answer was still arriving at the deadline", request=response.request)
    return bytes(body)


# The monotonic time by which the request this thread is sending must be over (see `within`).
_deadline: ContextVar[float | None] = ContextVar("odal_http_deadline", default=None)


@contextmanager
def within(deadline: float):
    """Every network read, write and connect of the request this thread sends inside the block
    ends by the monotonic `deadline` (on a connection of a DeadlineBackend): httpx's timeout
    holds for each read, so a peer trickling its status line or headers a byte at a time (before
    read_answer's deadline applies) would otherwise hold the request, and its thread, for ever."""
    token = _deadline.set(deadline)
    try:
        yield
    finally:
        _deadline.reset(token)


def _left(timeout: float | None, late: type[Exception]) -> float | None:
    """`timeout` cut to what is left of this thread's deadline; `late` raised once it passed."""
    deadline = _deadline.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise late("the request was still going at its deadline")
    return left if timeout is None else min(timeout, left)


class DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write ends by the deadline of the request using it."""

    def __init__(self, stream: httpcore.NetworkStream):
        self.stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.stream.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.stream.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self.stream.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        return DeadlineStream(
            self.stream.start_tls(ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout))
        )

    def get_extra_info(self, info: str):
        return self.stream.get_extra_info(info)


class DeadlineBackend(httpcore.NetworkBackend):
    """The network under a client whose requests have a deadline each (`within`)."""

    def __init__(self, network: httpcore.NetworkBackend | None = None):
        self.network = network or httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return DeadlineStream(
            self.network.connect_tcp(
                host,
                port,
                timeout=_left(timeout, httpcore.ConnectTimeout),
                local_address=local_address,
                socket_options=socket_options,
            )
        )

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return DeadlineStream(
            self.network.connect_unix_socket(
                path, timeout=_left(timeout, httpcore.ConnectTimeout), socket_options=socket_options
            )
        )

    def sleep(self, seconds):
        self.network.sleep(seconds)


def redirect_text(status: int, location: str | None) -> str:
    """What an answer redirecting elsewhere says in an error (no client follows one)."""
    where = f"to {storable(location, 300)}" if location else "without a Location"
    return f"HTTP {status} redirect {where} (not followed)"


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's own transport whose httpcore pool connects through a DeadlineBackend (each request
    ends by its deadline: `within`). HTTPTransport takes no network backend, so the pool it makes
    is replaced by one made as it makes it (same TLS context, limits and socket options; HTTP/1.1
    only), with that backend; the rest is httpx's. The registry adapter's transport."""

    def __init__(self, *, verify=True, limits: httpx.Limits, socket_options=None):
        ssl_context = httpx.create_ssl_context(verify=verify)
        super().__init__(verify=ssl_context, limits=limits, socket_options=socket_options)
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            http1=True,
            http2=False,
            socket_options=socket_options,
            network_backend=DeadlineBackend(),
        )
