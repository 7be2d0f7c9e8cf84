"""The client webhooks are sent with: HTTP/1.1 on asyncio, one event loop thread per client.

Measured (issue 26, item 2): through httpx a webhook cost about 1 ms of a sweep process's CPU
(httpx and httpcore per request, a pool thread and a Future per attempt, the GIL handed between
32 threads); h11 on asyncio 100 µs; this, asyncio streams with httptools' parser (C), about
25 µs. A pass hands its requests to the loop a set at a time (one thread hop, not one per
request), and the loop hands each ended attempt back through its future. On the whole sweep pass
(issue 40, `make bench`) it was faster than aiohttp's client in 7 rounds of 8 (1.2–2×) and than
httpx's in all (4.6–12×) (docs/performance.md, "The webhook client"): it stays for that.

What the httpx client did and this one keeps:
- Pinned: a connection goes to the address checked for its host (outbox.consumers.Target), and
  nowhere else: this client never looks a name up. The request names the host (Host header; for
  https the TLS server name, which the certificate is verified against).
- Kept alive: idle connections are pooled by scheme, host name, port and the address pinned, for
  KEEPALIVE_SECONDS; a connection carries no other name's request, nor one pinned elsewhere.
- Bounded: the caller holds each request to its deadline (asyncio.timeout: connecting, the TLS
  handshake, writing, the status line, the headers and the body, however slowly they trickle),
  and no more than `cap` bytes of an answer's body are read (the connection is closed on the rest).
- No proxy, no redirect followed, nothing inflated (requests ask for identity).
"""

import asyncio
import logging
import ssl
import threading
import time
from dataclasses import dataclass, field

import httptools
import httpx

try:  # libuv's loop: a request costs a third of the CPU it costs on asyncio's own (issue 26)
    import uvloop
except ImportError:  # (not on Windows)
    uvloop = None

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 5.0  # an idle connection is closed after this long (httpx's default)
IDLE_PER_ORIGIN = 64  # idle connections kept per origin (scheme, name, port, address)
IN_FLIGHT = 64  # requests in flight per client, all consumers together; the rest wait their turn
READ_SIZE = 65536
HEAD_CAP = 64 * 1024  # an answer's status line and headers: no more of them is read


# The names httpx gave these, kept: they are in the errors people read ("connection error: ReadError: …").
class HttpError(Exception):
    pass


class ConnectError(HttpError):
    pass


class WriteError(HttpError):
    pass


class ReadError(HttpError):
    pass


class RemoteProtocolError(HttpError):
    pass


@dataclass
class Answer:
    """What arrived of an answer, filled as it arrives: on a timeout or a broken connection the
    caller still has the status and the part of the body read."""

    status: int | None = None
    headers: dict = field(default_factory=dict)  # lower-case name -> value (bytes), the last one of a name
    body: bytearray = field(default_factory=bytearray)
    complete: bool = False  # the whole message arrived
    over_cap: bool = False  # more than the cap of its body arrived: no more is read
    received: int = 0  # bytes of it that arrived, head included

    def header(self, name: str) -> str:
        return self.headers.get(name.encode(), b"").decode("latin-1")


class _Parsing:
    """httptools' callbacks, into an Answer: the first whole answer after the request, and
    nothing after it (`extra`: bytes the peer sent past it, which also keep the connection from
    being kept: they would be read as the next request's answer)."""

    __slots__ = ("answer", "parser", "cap", "keep_alive", "until_close", "extra")

    def __init__(self):
        self.parser = httptools.HttpResponseParser(self)  # (one a connection: it reads answer after answer)

    def expect(self, answer: Answer, cap: int) -> None:
        self.answer, self.cap, self.keep_alive, self.until_close, self.extra = (
            answer,
            cap,
            False,
            False,
            False,
        )

    def on_message_begin(self) -> None:
        if self.answer.complete:
            self.extra = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.answer.complete:
            self.answer.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        if self.answer.complete:
            return
        self.answer.status = self.parser.get_status_code()
        # A body with neither a length nor chunks runs to the end of the connection (HTTP/1.0's
        # way, and HTTP/1.1's with "connection: close"): that end ends the answer (see _exchange).
        headers = self.answer.headers
        self.until_close = (
            b"content-length" not in headers
            and b"chunked" not in headers.get(b"transfer-encoding", b"").lower()
        )

    def on_body(self, chunk: bytes) -> None:
        if self.answer.complete:
            self.extra = True
            return
        body = self.answer.body
        body += chunk[: self.cap + 1 - len(body)]  # (one byte past the cap says it was passed)
        if len(body) > self.cap:
            self.answer.over_cap = True

    def on_message_complete(self) -> None:
        if self.answer.complete:
            return
        if 100 <= self.answer.status < 200:  # (an interim answer, 100 Continue: the answer follows)
            self.answer.status, self.answer.headers = None, {}
            return
        # Asked now: once feed_data returns, the parser is ready for the next message, and what
        # it says of keep-alive then is that blank message's (not kept, after a body). Never
        # set for an answer read only to the cap: its connection has the rest on it.
        self.answer.complete, self.keep_alive = True, self.parser.should_keep_alive()


async def open_stream(
    address: str, port: int, ssl_context: ssl.SSLContext | None, server_hostname: str | None
):
    """A connection to exactly `address` (an IP literal: asyncio looks nothing up for one)."""
    return await asyncio.open_connection(
        address, port, ssl=ssl_context, server_hostname=server_hostname if ssl_context else None
    )


@dataclass(eq=False)
class _Connection:
    reader: object
    writer: object
    used_at: float = 0.0
    parsing: _Parsing = field(default_factory=_Parsing)

    def usable(self, now: float) -> bool:
        """Kept no longer than KEEPALIVE_SECONDS, still open, and with nothing the peer sent
        while it was idle (an answer to no request, a 408, the end: read as the next request's
        answer, it would be taken for it)."""
        return (
            now - self.used_at < KEEPALIVE_SECONDS
            and not self.writer.is_closing()
            and not self.reader.at_eof()
            and self.reader.exception() is None
            # (asyncio's StreamReader keeps what arrived in _buffer; it says so nowhere public)
            and not getattr(self.reader, "_buffer", b"")
        )

    def close(self) -> None:
        """Closed now, whatever is still to be written: a plain close waits for the write buffer
        to drain, so a request whose peer stopped reading would keep its socket (and payload)
        after its attempt timed out, and could still arrive whole later."""
        try:
            transport = getattr(self.writer, "transport", None)
            if transport is not None:
                transport.abort()
            else:
                self.writer.close()
        except Exception:  # (a transport already gone)
            pass


class WebhookClient:
    """An event loop on a thread of its own, and the connections it keeps. `send` is for a
    caller on another thread that waits (one request); `submit` hands the loop a set of
    coroutines that report through their own futures (a sweep's pass), which hold one of its
    `slots` per request. `verify` as httpx's (True: its trust store; an SSLContext of a test's).
    `network` opens a connection (open_stream by default; a test's fake). Close it (or use it as
    a context manager): its thread and connections end."""

    def __init__(
        self, *, verify: ssl.SSLContext | bool = True, network=None, in_flight: int = IN_FLIGHT, answers=None
    ):
        self.answers = answers  # the lookups of its hosts (outbox.consumers.Answers)
        self.ssl_context = httpx.create_ssl_context(verify=verify)  # (httpx's trust store, as before)
        self.network = network or open_stream
        self.idle: dict[tuple, list[_Connection]] = {}
        self.lookups: dict[str, asyncio.Future] = {}  # host -> its lookup under way
        self.tasks: set = set()
        self.loop = uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
        self.slots = asyncio.Semaphore(in_flight)
        self.pruned_at = time.monotonic()
        self.thread = threading.Thread(target=self.run, name="odal-webhooks", daemon=True)
        self.thread.start()

    def run(self) -> None:
        """The loop's thread."""
        self.loop.run_forever()

    # -- from other threads -------------------------------------------------------------------------

    def send(self, coroutine):
        """Run `coroutine` on the loop, within a slot, and wait for what it returns (a close
        meanwhile cancels it: CancelledError)."""
        return asyncio.run_coroutine_threadsafe(self._tracked(self._in_a_slot(coroutine)), self.loop).result()

    def submit(self, coroutines: list) -> None:
        """Start `coroutines` on the loop (they take a slot per request: `slots`): one hand-over
        for all."""
        if coroutines:
            self.loop.call_soon_threadsafe(self._start, coroutines)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._shut(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- on the loop ----------------------------------------------------------------------------------

    async def lookup(self, host: str, resolve):
        """`resolve(host)` (a blocking lookup) on a thread of its own, one at a time per host
        (callers of a host already being looked up wait for that one): a lookup that hangs holds
        no other host's, nor the loop. The threads are daemons: one hung in the resolver does
        not hold the process's exit, nor the client's close."""
        pending = self.lookups.get(host)
        if pending is None:
            pending = self.lookups[host] = self.loop.create_future()
            pending.add_done_callback(lambda done: done.cancelled() or done.exception())  # (retrieved)

            def run() -> None:
                try:
                    result, error = resolve(host), None
                except BaseException as exc:  # (Refused, or anything: the waiters get it)
                    result, error = None, exc
                try:
                    self.loop.call_soon_threadsafe(self._looked_up, host, pending, result, error)
                except RuntimeError:  # (the client closed meanwhile: nobody waits)
                    pass

            threading.Thread(target=run, name="odal-webhook-lookup", daemon=True).start()
        return await asyncio.shield(pending)  # (a waiter's timeout does not end the others' wait)

    def _looked_up(self, host: str, pending, result, error) -> None:
        if self.lookups.get(host) is pending:
            del self.lookups[host]
        if not pending.done():
            pending.set_exception(error) if error is not None else pending.set_result(result)

    def _start(self, coroutines: list) -> None:
        for coroutine in coroutines:
            task = self.loop.create_task(coroutine)
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _tracked(self, coroutine):
        task = asyncio.current_task()
        self.tasks.add(task)
        try:
            return await coroutine
        finally:
            self.tasks.discard(task)

    async def _in_a_slot(self, coroutine):
        async with self.slots:
            return await coroutine

    async def _shut(self) -> None:
        for task in list(self.tasks):  # (a pass that ended early: its attempts are not waited for)
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks))
        for connections in self.idle.values():
            for connection in connections:
                connection.close()
        self.idle.clear()

    async def request(
        self, *, https: bool, name: str, address: str, port: int, data: bytes, answer: Answer, cap: int
    ) -> None:
        """Send `data` (a whole HTTP/1.1 request) to `name` at `address` and read its answer into
        `answer`: its status, headers and no more than `cap` bytes of its body. A kept-alive
        connection that the peer closed meanwhile (nothing of an answer arrived on it) is given
        up for a new one, once. Raises HttpError; the caller's timeout cancels it anywhere."""
        key = (https, name, port, address)
        connection = self._idle(key)
        if connection is not None:
            try:
                await self._exchange(connection, key, data, answer, cap)
                return
            except (WriteError, ReadError):
                if answer.received:
                    raise
                # Nothing of an answer came: the peer closed it while it was idle. The request
                # goes again, on a new connection (a webhook may arrive twice: its id says so).
        connection = await self._connect(https, name, address, port)
        await self._exchange(connection, key, data, answer, cap)

    def _idle(self, key: tuple) -> _Connection | None:
        now = time.monotonic()
        kept = self.idle.get(key)
        while kept:
            connection = kept.pop()
            if connection.usable(now):
                return connection
            connection.close()
        return None

    async def _connect(self, https: bool, name: str, address: str, port: int) -> _Connection:
        try:
            reader, writer = await self.network(address, port, self.ssl_context if https else None, name)
        except (OSError, EOFError) as exc:  # (refused, unreachable, reset, a TLS handshake failed)
            raise ConnectError(_reason(exc)) from exc
        return _Connection(reader, writer)

    async def _exchange(
        self, connection: _Connection, key: tuple, data: bytes, answer: Answer, cap: int
    ) -> None:
        kept = False
        try:
            try:
                connection.writer.write(data)
                await connection.writer.drain()
            except (OSError, RuntimeError) as exc:  # (RuntimeError: a transport closed under us)
                raise WriteError(_reason(exc)) from exc
            parsing = connection.parsing
            parsing.expect(answer, cap)
            while not (answer.complete or answer.over_cap):
                try:
                    chunk = await connection.reader.read(READ_SIZE)
                except OSError as exc:
                    raise ReadError(_reason(exc)) from exc
                answer.received += len(chunk)
                if answer.status is None and answer.received > HEAD_CAP:
                    raise RemoteProtocolError(
                        f"the answer's status line and headers ran past {HEAD_CAP} bytes"
                    )
                try:
                    if not chunk:
                        if answer.status is not None and parsing.until_close:
                            answer.complete = True  # (not kept: keep_alive was never set)
                            break
                        raise ReadError("the peer closed the connection before the answer was whole")
                    parsing.parser.feed_data(chunk)
                except httptools.HttpParserUpgrade:
                    raise RemoteProtocolError("the peer asked to switch protocols") from None
                except httptools.HttpParserError as exc:
                    if not answer.complete:
                        raise RemoteProtocolError(f"not an HTTP/1.1 answer ({exc})") from None
                    parsing.extra = True  # (what came after a whole answer is not read: see _Parsing)
            kept = parsing.keep_alive and not parsing.extra  # (only a whole answer, and nothing after it)
        finally:
            if kept:
                self._keep(key, connection)
            else:
                connection.close()

    def _keep(self, key: tuple, connection: _Connection) -> None:
        connection.used_at = now = time.monotonic()
        kept = self.idle.setdefault(key, [])
        if len(kept) < IDLE_PER_ORIGIN:
            kept.append(connection)
        else:
            connection.close()
        if now - self.pruned_at >= KEEPALIVE_SECONDS:  # connections to origins no longer called
            self.pruned_at = now
            for origin, connections in list(self.idle.items()):
                for gone in [c for c in connections if not c.usable(now)]:
                    gone.close()
                    connections.remove(gone)
                if not connections:
                    del self.idle[origin]


def _reason(exc: BaseException) -> str:
    """What an OS error says, with its kind (a reset, a refusal) when it says nothing itself."""
    text = str(exc)
    return text if text else type(exc).__name__
