"""Webhook targets are pinned: the request connects to exactly the address that was checked, while
it still names the consumer's host (Host header; for https the TLS server name and the name the
certificate is verified against). A second lookup when connecting could answer otherwise: a
rebinding DNS server answers the check with a public address and the connection with an
internal one. The pin is made when connecting (the webhook client connects to the address and
names the host), not by sending the request to the address, so connections are pooled by name
(and address) and kept alive, https included.

Network rule of these tests: no traffic leaves 127.0.0.0/8. Names are answered by a scripted
resolver; public addresses appear only under a fake network that never connects (Wire)."""

import ipaddress
import re
import socket
import ssl
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from odal.core.errors import Refused
from outbox import consumers, webhook_client
from outbox.events import emit
from outbox.models import Delivery
from outbox.sweep import sweep_once
from tests.certificates import self_signed
from tests.factories import WebhookConsumerFactory
from tests.waiting import sweeping
from tests.webhook_server import WebhookServer

pytestmark = pytest.mark.django_db

REBIND = "hooks.rebind.test"
real_getaddrinfo = socket.getaddrinfo


@pytest.fixture(autouse=True)
def _no_backoff(settings):
    settings.ODAL_BACKOFF_BASE_SECONDS = 0


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch):
    """The network rule, enforced: should the pinning ever be bypassed (a broken build, a mutant),
    a socket of this process asked to connect to a public address a test names is refused here
    instead of connecting."""
    connect = socket.socket.connect

    def loopback_only(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                loopback = ipaddress.ip_address(address[0]).is_loopback
            except ValueError:
                loopback = False
            if not loopback:
                raise ConnectionRefusedError(f"these tests connect to loopback only, not to {address[0]}")
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", loopback_only)


class Resolver:
    """socket.getaddrinfo for scripted names: each lookup of a name takes the next answer of its
    script (the last one repeats); any other host (an IP literal) resolves as usual. Records the
    host of every lookup, scripted or not."""

    def __init__(self, scripts: dict[str, list[list[str]]]):
        self.scripts = {name: list(answers) for name, answers in scripts.items()}
        self.lookups: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, host, port, *args, **kwargs):
        with self.lock:
            self.lookups.append(host)
            script = self.scripts.get(host)
            if script is None:
                return real_getaddrinfo(host, port, *args, **kwargs)
            answer = script.pop(0) if len(script) > 1 else script[0]
        return [self.info(address, port or 0) for address in answer]

    @staticmethod
    def info(address: str, port: int) -> tuple:
        if ":" in address:
            return (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port, 0, 0))
        return (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))

    def of(self, name: str) -> list[str]:
        return [host for host in self.lookups if host == name]


@pytest.fixture
def resolver(monkeypatch):
    def install(scripts: dict[str, list[list[str]]]) -> Resolver:
        fake = Resolver(scripts)
        monkeypatch.setattr(socket, "getaddrinfo", fake)
        return fake

    return install


def pretend_public(monkeypatch, address: str) -> None:
    """Production refuses loopback targets, and these tests may reach nothing else: here `address`
    plays a public host (every other loopback address stays internal)."""
    is_global = ipaddress.IPv4Address.is_global.fget
    pretended = ipaddress.ip_address(address)
    monkeypatch.setattr(
        ipaddress.IPv4Address, "is_global", property(lambda self: self == pretended or is_global(self))
    )


@dataclass
class Seen:
    client_port: int  # the connection it came on
    host: str | None
    server_name: str | None  # TLS SNI of that connection


class Peer:
    """A bare HTTP(S) server on one loopback address: answers 204 and records each request's
    connection, Host header and (TLS) server name, and counts TLS handshakes."""

    def __init__(self, address="127.0.0.1", port=0, tls: ssl.SSLContext | None = None, answer=(204, b"")):
        self.seen: list[Seen] = []
        self.handshakes = 0
        self.close_connections = False
        peer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self):
                close = peer.close_connections  # (as it was when the request came, not after the answer)
                self.rfile.read(int(self.headers.get("content-length") or 0))
                name = getattr(self.connection, "server_name", None)
                peer.seen.append(Seen(self.client_address[1], self.headers.get("host"), name))
                status, body = answer
                self.send_response(status)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                if close:  # (after the answer, which says nothing of it)
                    self.close_connection = True

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # a client that refused our certificate hung up: no news

        self.httpd = Server((address, port), Handler)
        if tls is not None:

            def hello(sock, name, context):
                peer.handshakes += 1  # (one server thread accepts, and shakes hands, in turn)
                sock.server_name = name

            tls.sni_callback = hello
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def connections(self) -> int:
        return len({seen.client_port for seen in self.seen})


def deliver(consumer, client) -> consumers.Outcome:
    event, _ = emit("passport.published", {"dppId": "abc"})
    return consumers.call(consumer, Delivery.objects.get(event=event, consumer=consumer).pk, event, client)


# -- DNS rebinding, against real local servers ---------------------------------------------------


@pytest.mark.parametrize("production", [True, False], ids=["production", "private_allowed"])
def test_a_name_that_rebinds_after_the_check_is_connected_to_at_the_checked_address(
    settings, monkeypatch, resolver, production
):
    """The rebinding server answers the first lookup of hooks.rebind.test with 127.0.0.1 (here:
    the public webhook) and every later one with 127.0.0.2 (here: an internal service listening
    at the same port). Only the first answer was checked, so only it may be connected to."""
    if production:
        pretend_public(monkeypatch, "127.0.0.1")
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = not production
    with WebhookServer() as public:
        port = public.httpd.server_address[1]
        with Peer("127.0.0.2", port) as internal:
            dns = resolver({REBIND: [["127.0.0.1"], ["127.0.0.2"]]})
            WebhookConsumerFactory(url=f"http://{REBIND}:{port}/hooks")
            emit("passport.published", {"dppId": "abc"})
            report = sweep_once()
    delivery = Delivery.objects.get()
    print(
        f"delivery {delivery.status} (error {delivery.last_error!r}); {REBIND} looked up "
        f"{len(dns.of(REBIND))} time(s); the public webhook got {len(public.received)} request(s), "
        f"the internal service at 127.0.0.2:{port} got {len(internal.seen)}"
    )
    assert internal.seen == [], "the request reached the address of a second lookup"
    assert (report.delivered, delivery.status) == (1, "delivered"), delivery.last_error
    assert dns.of(REBIND) == [REBIND]  # resolved once
    assert public.received[0].headers["host"] == f"{REBIND}:{port}"


def test_a_name_that_resolves_inside_in_production_is_not_connected_to(settings, resolver):
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = False
    with Peer() as server:
        resolver({REBIND: [["127.0.0.1"]]})
        consumer = WebhookConsumerFactory(url=f"http://{REBIND}:{server.port}/hooks")
        with consumers.webhook_client() as client:
            outcome = deliver(consumer, client)
    assert server.seen == []
    assert not outcome.ok and outcome.error.startswith(
        f"not called: {REBIND} resolves to 127.0.0.1, an internal address"
    )


def test_plain_http_connections_are_kept_alive_and_reused_per_name(resolver):
    """Two names at one address: each name's requests ride one kept-alive connection of its own
    (connections are pooled by name), each with its own Host header."""
    with Peer() as server, consumers.webhook_client() as client:
        dns = resolver({"a.hooks.test": [["127.0.0.1"]], "b.hooks.test": [["127.0.0.1"]]})
        a = WebhookConsumerFactory(name="a", url=f"http://a.hooks.test:{server.port}/hooks")
        b = WebhookConsumerFactory(name="b", url=f"http://b.hooks.test:{server.port}/hooks")
        outcomes = [deliver(a, client), deliver(b, client), deliver(a, client), deliver(b, client)]
    assert all(outcome.ok for outcome in outcomes), outcomes
    hosts = [seen.host for seen in server.seen]
    assert hosts == [f"{name}.hooks.test:{server.port}" for name in "abab"]
    ports = [seen.client_port for seen in server.seen]
    assert ports[0] == ports[2] and ports[1] == ports[3] and ports[0] != ports[1]
    assert server.connections == 2
    assert dns.of("a.hooks.test") == ["a.hooks.test"]  # looked up once in DNS_CACHE_SECONDS


@pytest.mark.parametrize("answer", [(500, b"failed"), (200, b'{"ok": true}')], ids=["500", "200"])
def test_an_answer_with_a_body_leaves_its_connection_kept_alive(resolver, answer):
    """Whether the peer keeps the connection is read when its answer ends: the parser, ready for
    the next answer by then, would say no once there was a body (every failure answered with a
    page, every 2xx with a body, would cost a new connection)."""
    resolver({"a.hooks.test": [["127.0.0.1"]]})
    with Peer(answer=answer) as server, consumers.webhook_client() as client:
        consumer = WebhookConsumerFactory(url=f"http://a.hooks.test:{server.port}/hooks")
        outcomes = [deliver(consumer, client) for _ in range(3)]
    assert [(o.http_status, o.answer) for o in outcomes] == [(answer[0], answer[1].decode())] * 3
    assert server.connections == 1


def test_a_kept_connection_the_peer_closed_meanwhile_is_given_up_for_a_new_one(resolver, monkeypatch):
    """A peer may close an idle kept-alive connection at any moment, and the client may take it
    before it sees the close: the request then goes again on a new connection, once (nothing
    of an answer came on the old one). Here every kept connection is taken as if still open."""
    monkeypatch.setattr(webhook_client._Connection, "usable", lambda connection, now: True)
    resolver({"a.hooks.test": [["127.0.0.1"]]})
    with Peer() as server, consumers.webhook_client() as client:
        consumer = WebhookConsumerFactory(url=f"http://a.hooks.test:{server.port}/hooks")
        first = deliver(consumer, client)
        server.close_connections = True  # the second answer ends its connection (the first's)
        second, third = deliver(consumer, client), deliver(consumer, client)
    assert (first.ok, second.ok, third.ok) == (True, True, True), (second.error, third.error)
    assert server.connections == 2  # the third went on the first, found it closed, and again on a new one


def test_concurrent_deliveries_on_the_sweeps_threads_each_connect_to_their_own_names_address(
    settings, resolver
):
    """The pin travels with each request on its own pool thread: twenty deliveries at once to two
    names at two addresses, each arriving where its own name was checked to be."""
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = True
    with Peer("127.0.0.1") as one, Peer("127.0.0.3", one.port) as three:
        resolver({"one.hooks.test": [["127.0.0.1"]], "three.hooks.test": [["127.0.0.3"]]})
        WebhookConsumerFactory(name="one", url=f"http://one.hooks.test:{one.port}/hooks")
        WebhookConsumerFactory(name="three", url=f"http://three.hooks.test:{one.port}/hooks")
        for n in range(10):
            emit("passport.published", {"n": n})
        report = sweep_once()
    assert report.delivered == 20, Delivery.objects.exclude(status="delivered").values_list("last_error")
    assert [seen.host for seen in one.seen] == [f"one.hooks.test:{one.port}"] * 10
    assert [seen.host for seen in three.seen] == [f"three.hooks.test:{one.port}"] * 10


# -- TLS: connected to the address, verified for the name -----------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for a.hooks.test only (no IP address in it)."""
    cert, key = self_signed(tmp_path_factory.mktemp("tls"), "a.hooks.test")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))


def test_https_connects_to_the_address_and_verifies_the_name(resolver, certificate):
    """The certificate names a.hooks.test and no address: the TLS handshake must send that name
    (SNI) and check the certificate against it, though the connection goes to 127.0.0.1."""
    server_tls, trusted = certificate
    with Peer(tls=server_tls) as server, consumers.webhook_client(verify=trusted) as client:
        dns = resolver({"a.hooks.test": [["127.0.0.1"], ["127.0.0.2"]]})
        consumer = WebhookConsumerFactory(url=f"https://a.hooks.test:{server.port}/hooks")
        outcome = deliver(consumer, client)
    assert outcome.ok, outcome.error
    assert server.seen == [Seen(server.seen[0].client_port, f"a.hooks.test:{server.port}", "a.hooks.test")]
    assert dns.of("a.hooks.test") == ["a.hooks.test"]


def test_https_connections_are_kept_alive_and_reused(resolver, certificate):
    """Three deliveries to one name: one connection, one TLS handshake (the name's addresses are
    checked before each request; the connection was verified when it was made)."""
    server_tls, trusted = certificate
    with Peer(tls=server_tls) as server, consumers.webhook_client(verify=trusted) as client:
        dns = resolver({"a.hooks.test": [["127.0.0.1"]]})
        consumer = WebhookConsumerFactory(url=f"https://a.hooks.test:{server.port}/hooks")
        outcomes = [deliver(consumer, client) for _ in range(3)]
    assert all(outcome.ok for outcome in outcomes), outcomes
    assert [seen.server_name for seen in server.seen] == ["a.hooks.test"] * 3
    assert (server.handshakes, server.connections) == (1, 1)
    assert dns.of("a.hooks.test") == ["a.hooks.test"]  # looked up once in DNS_CACHE_SECONDS


def test_a_tls_connection_verified_for_one_name_does_not_carry_another_names_request(resolver, certificate):
    """b.hooks.test is at the same address as a.hooks.test but the server has no certificate for
    it: b's request must fail its own certificate check, not ride the kept-alive connection that
    was verified for a (connections are pooled by name, not by address)."""
    server_tls, trusted = certificate
    with Peer(tls=server_tls) as server, consumers.webhook_client(verify=trusted) as client:
        resolver({"a.hooks.test": [["127.0.0.1"]], "b.hooks.test": [["127.0.0.1"]]})
        a = WebhookConsumerFactory(name="a", url=f"https://a.hooks.test:{server.port}/hooks")
        b = WebhookConsumerFactory(name="b", url=f"https://b.hooks.test:{server.port}/hooks")
        first, second, third = deliver(a, client), deliver(b, client), deliver(a, client)
    assert first.ok and third.ok, (first.error, third.error)
    assert not second.ok and "CERTIFICATE_VERIFY_FAILED" in second.error, second.error
    assert [seen.host for seen in server.seen] == [f"a.hooks.test:{server.port}"] * 2
    assert server.handshakes == 2  # a's (kept alive for its second request) and b's, refused


# -- where connections go, under a network that never connects (Wire) -------------------------------


class Line:
    """A connection that is not (its reader and its writer): keeps what is written on it and
    answers 204 to each request."""

    def __init__(self, address: str, port: int):
        self.address, self.port = address, port
        self.server_name: str | None = None  # TLS: the name sent and verified
        self.ssl_context: ssl.SSLContext | None = None
        self.written = b""

    def write(self, buffer):
        self.written += buffer

    async def drain(self):
        pass

    async def read(self, max_bytes):
        return b"HTTP/1.1 204 No Content\r\n\r\n"

    def at_eof(self):
        return False

    def exception(self):
        return None

    def is_closing(self):
        return False

    def close(self):
        pass

    @property
    def requests(self) -> list[tuple[str, str]]:
        """The target and Host header of each request written."""
        heads = re.findall(rb"POST (\S+) HTTP/1\.1\r\n(.*?)\r\n\r\n", self.written, re.S)
        return [
            (target.decode(), re.search(rb"(?im)^host: ([^\r]*)", head).group(1).decode())
            for target, head in heads
        ]


class Wire:
    """The network under the webhook client where public addresses appear: connects nowhere,
    records each connection it is asked for (outbox.webhook_client.open_stream's signature)."""

    def __init__(self):
        self.lines: list[Line] = []

    async def __call__(self, address, port, ssl_context, server_hostname):
        line = Line(address, port)
        if ssl_context is not None:
            line.ssl_context, line.server_name = ssl_context, server_hostname
        self.lines.append(line)
        return line, line


def sent(consumer, deliveries=1) -> tuple[list[consumers.Outcome], Wire]:
    wire = Wire()
    with consumers.webhook_client(network=wire) as client:
        return [deliver(consumer, client) for _ in range(deliveries)], wire


def verifies(context: ssl.SSLContext) -> bool:
    return context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


@pytest.mark.parametrize(
    "answer, address",
    [
        (["93.184.215.14"], "93.184.215.14"),
        # several addresses: the first (the resolver's order) is connected to
        (
            ["2606:2800:21f:cb07:6820:80da:af6b:8b2c", "93.184.215.14"],
            "2606:2800:21f:cb07:6820:80da:af6b:8b2c",
        ),
    ],
    ids=["ipv4", "ipv6_first_of_several"],
)
def test_in_production_the_request_goes_to_the_checked_address_in_the_name_of_the_host(
    settings, resolver, answer, address
):
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = False
    # a second lookup would answer an internal address: it must never be made
    dns = resolver({"hooks.example.com": [answer, ["127.0.0.1"]]})
    consumer = WebhookConsumerFactory(url="https://hooks.example.com:8443/hooks?x=1")
    (outcome,), wire = sent(consumer)
    assert outcome.ok, outcome.error
    (line,) = wire.lines
    assert (line.address, line.port) == (address, 8443)
    assert line.server_name == "hooks.example.com" and verifies(line.ssl_context)
    assert line.requests == [("/hooks?x=1", "hooks.example.com:8443")]
    assert b"connection: close" not in line.written.lower()
    assert dns.lookups == ["hooks.example.com"]


def test_an_ipv6_literal_is_connected_to_as_it_is(settings, resolver):
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = False
    dns = resolver({})
    (outcome,), wire = sent(WebhookConsumerFactory(url="https://[2606:4700:4700::1111]/hooks"))
    assert outcome.ok, outcome.error
    (line,) = wire.lines
    assert (line.address, line.port) == ("2606:4700:4700::1111", 443)
    assert line.server_name == "2606:4700:4700::1111" and verifies(line.ssl_context)
    assert line.requests == [("/hooks", "[2606:4700:4700::1111]")]
    assert dns.lookups == []


def test_plain_http_names_the_host_and_keeps_alive(settings, resolver):
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = False
    resolver({"hooks.example.com": [["93.184.215.14"]]})
    outcomes, wire = sent(WebhookConsumerFactory(url="http://hooks.example.com/hooks"), deliveries=2)
    assert all(outcome.ok for outcome in outcomes), outcomes
    (line,) = wire.lines
    assert (line.address, line.port, line.server_name) == ("93.184.215.14", 80, None)
    assert line.requests == [("/hooks", "hooks.example.com")] * 2


class Clock:
    """time.monotonic for a client's Answers, moved by the test."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_in_production_a_kept_alive_connection_is_not_used_once_its_name_resolves_inside(settings, resolver):
    """Its lookup is kept DNS_CACHE_SECONDS; once it is older, the name is looked up again before
    the next request, a pooled connection or not, and an internal answer stops it."""
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = False
    dns = resolver({"hooks.example.com": [["93.184.215.14"], ["10.0.0.8"]]})
    consumer = WebhookConsumerFactory(url="https://hooks.example.com/hooks")
    wire, clock = Wire(), Clock()
    with consumers.webhook_client(network=wire) as client:
        client.answers.clock = clock
        first, kept = deliver(consumer, client), deliver(consumer, client)
        clock.now += consumers.DNS_CACHE_SECONDS - 0.001
        still = deliver(consumer, client)
        clock.now += 0.001
        second = deliver(consumer, client)
    assert first.ok and kept.ok and still.ok, (first, kept, still)
    assert second.error.startswith("not called: hooks.example.com resolves to 10.0.0.8, an internal address")
    assert dns.of("hooks.example.com") == ["hooks.example.com"] * 2
    (line,) = wire.lines
    assert len(line.requests) == 3


def test_a_kept_answer_is_checked_again_at_every_use(settings, resolver):
    """An answer kept while private targets were allowed is refused once they are not: the
    check is made at every request, only the lookup is kept."""
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = True
    resolver({"hooks.example.com": [["10.0.0.8"]]})
    consumer = WebhookConsumerFactory(url="https://hooks.example.com/hooks")
    with consumers.webhook_client(network=Wire()) as client:
        allowed = deliver(consumer, client)
        settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = False
        refused = deliver(consumer, client)
    assert allowed.ok, allowed.error
    assert refused.error.startswith("not called: hooks.example.com resolves to 10.0.0.8, an internal address")


def test_a_name_that_did_not_resolve_is_asked_again_and_the_oldest_answer_goes_first(resolver):
    """A failed lookup is not kept; past its size, the answer looked up longest ago goes."""
    dns = resolver({"late.hooks.test": [[], ["127.0.0.1"]], "a.hooks.test": [["127.0.0.2"]]})
    answers = consumers.Answers(size=2)
    with pytest.raises(Refused, match="does not resolve"):
        answers.addresses("late.hooks.test")
    assert answers.addresses("late.hooks.test") == [ipaddress.ip_address("127.0.0.1")]
    answers.addresses("a.hooks.test")
    answers.addresses("late.hooks.test")  # kept
    answers.addresses("127.0.0.3")  # a third name: late.hooks.test, the oldest, goes
    answers.addresses("a.hooks.test")  # kept
    answers.addresses("late.hooks.test")
    assert dns.of("late.hooks.test") == ["late.hooks.test"] * 3
    assert dns.of("a.hooks.test") == ["a.hooks.test"]


@pytest.mark.parametrize(
    "answer, internal",
    [(["93.184.215.14", "10.0.0.8"], "10.0.0.8"), (["2606:4700:4700::1111", "::1"], "::1")],
    ids=["ipv4", "ipv6"],
)
def test_in_production_a_name_with_any_internal_address_is_not_called(settings, resolver, answer, internal):
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = False
    resolver({"hooks.example.com": [answer]})
    (outcome,), wire = sent(WebhookConsumerFactory(url="https://hooks.example.com/hooks"))
    assert wire.lines == []
    assert outcome.error.startswith(
        f"not called: hooks.example.com resolves to {internal}, an internal address"
    )


@pytest.mark.parametrize(
    "host", ["a..b.hooks.test", f"{'a' * 64}.hooks.test"], ids=["empty_label", "long_label"]
)
def test_a_name_the_resolver_cannot_even_encode_is_not_called(host):
    """getaddrinfo raises UnicodeError, not gaierror, for a name with an empty or over-long label:
    it escaped call_webhook (a stored URL is only resolved when private targets are refused)."""
    (outcome,), wire = sent(WebhookConsumerFactory(url=f"http://{host}/hooks"))
    assert wire.lines == []
    assert outcome.error == f"not called: The webhook host {host} does not resolve."


def test_a_name_that_does_not_resolve_is_not_called(resolver):
    resolver({"gone.hooks.test": [[]]})
    (outcome,), wire = sent(WebhookConsumerFactory(url="http://gone.hooks.test/hooks"))
    assert wire.lines == []
    assert outcome.error == "not called: The webhook host gone.hooks.test does not resolve."


# -- no pin, no connection --------------------------------------------------------------------------


def test_a_kept_connection_carries_only_requests_to_its_own_name_and_address():
    """Connections are kept by scheme, name, port and the address pinned: a request pinned to
    another address (its name moved) or naming another host never goes on one made for another."""
    wire = Wire()

    def post(client, name, address, https=True):
        answer = webhook_client.Answer()
        request = f"POST /hooks HTTP/1.1\r\nhost: {name}\r\ncontent-length: 0\r\n\r\n".encode()
        client.send(
            client.request(
                https=https, name=name, address=address, port=443, data=request, answer=answer, cap=10
            )
        )
        assert answer.status == 204

    with consumers.webhook_client(network=wire) as client:
        post(client, "a.example.com", "93.184.215.14")
        post(client, "a.example.com", "93.184.215.14")  # kept alive
        post(client, "b.example.com", "93.184.215.14")  # another name, the same address
        post(client, "a.example.com", "93.184.215.15")  # a's name, pinned elsewhere
        post(client, "a.example.com", "93.184.215.14", https=False)  # another scheme
    assert [(line.address, line.server_name, line.requests) for line in wire.lines] == [
        ("93.184.215.14", "a.example.com", [("/hooks", "a.example.com")] * 2),
        ("93.184.215.14", "b.example.com", [("/hooks", "b.example.com")]),
        ("93.184.215.15", "a.example.com", [("/hooks", "a.example.com")]),
        ("93.184.215.14", None, [("/hooks", "a.example.com")]),
    ]


def test_call_webhook_sends_with_no_client_but_the_pinned_one(resolver):
    """A plain httpx.Client would look the host up again when connecting: refused, loudly."""
    resolver({"hooks.example.com": [["93.184.215.14"]]})
    consumer = WebhookConsumerFactory(url="https://hooks.example.com/hooks")
    requests = []

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(204, content=iter([b""]))  # a stream, as from a connection

    client = httpx.Client(transport=httpx.MockTransport(answer))  # (any other client: httpx's, say)
    with client, pytest.raises(TypeError, match=r"client made by webhook_client\(\)"):
        deliver(consumer, client)
    assert requests == []


# -- lookups that hang --------------------------------------------------------------------------------


class HangingResolver:
    """socket.getaddrinfo where names starting with "hung" wait for `release` (and then do not
    resolve) and other *.hooks.test names answer 127.0.0.1 at once."""

    def __init__(self):
        self.release, self.asked, self.lock = threading.Event(), [], threading.Lock()

    def __call__(self, host, port, *args, **kwargs):
        if host.endswith(".hooks.test"):
            with self.lock:
                self.asked.append(host)
            if host.startswith("hung"):
                self.release.wait(30)
                return []
            return [Resolver.info("127.0.0.1", port or 0)]
        return real_getaddrinfo(host, port, *args, **kwargs)

    def waiting(self, count: int, seconds: float = 10) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with self.lock:
                if sum(host.startswith("hung") for host in self.asked) >= count:
                    return True
            time.sleep(0.01)
        return False


def test_lookups_that_hang_hold_no_other_hosts_request_and_end_at_the_timeout(monkeypatch):
    """Each host is looked up on a thread of its own (one at a time per host), inside the
    request's timeout: eight hosts whose lookups hang (more than a shared pool's threads) hold
    no other host's request, and each of their attempts ends at its own timeout."""
    dns = HangingResolver()
    monkeypatch.setattr(socket, "getaddrinfo", dns)
    event, _ = emit("passport.published", {"dppId": "abc"})
    with Peer() as server, consumers.webhook_client() as client, ThreadPoolExecutor(8) as callers:
        hung = [
            WebhookConsumerFactory(url=f"http://hung{n}.hooks.test:{server.port}/hooks", timeout_seconds=1)
            for n in range(8)
        ]
        fast = WebhookConsumerFactory(url=f"http://fast.hooks.test:{server.port}/hooks", timeout_seconds=5)
        waits = [callers.submit(consumers.call, c, uuid.uuid4(), event, client) for c in hung]
        assert dns.waiting(8)
        quick = consumers.call(fast, uuid.uuid4(), event, client)  # while the eight hang
        ended = [wait.result(20) for wait in waits]
        dns.release.set()
    assert quick.ok, quick.error
    assert [outcome.error for outcome in ended] == ["timed out after 1s"] * 8


def slow_lookup(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """slow.hooks.test's lookup waits (its `asked` set) until `release`, then gives 127.0.0.1."""
    asked, release = threading.Event(), threading.Event()

    def getaddrinfo(host, port, *args, **kwargs):
        if host == "slow.hooks.test":
            asked.set()
            release.wait(30)
            return [Resolver.info("127.0.0.1", port or 0)]
        return real_getaddrinfo(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked, release


@pytest.mark.django_db(transaction=True)
def test_no_request_starts_when_its_hosts_lookup_outlasted_the_claims_hold(settings, monkeypatch):
    """The claim's hold is asked again once the host is looked up: a lookup that outlasted it
    starts no request (the row may be another sweep's by then); the row is given back."""
    settings.ODAL_CLAIM_HOLD_SECONDS = 1
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = True
    asked, release = slow_lookup(monkeypatch)
    with Peer() as server:
        WebhookConsumerFactory(url=f"http://slow.hooks.test:{server.port}/hooks", timeout_seconds=10)
        emit("passport.published", {"dppId": "abc"})
        sweeper, box = sweeping()
        assert asked.wait(10)
        time.sleep(1.5)  # past the hold (1 s from the claim, made before the lookup was asked)
        release.set()
        sweeper.join(20)
    assert server.seen == [], "a request started after the claim's hold ran out"
    assert box["report"].not_started == 1 and box["report"].delivered == 0
    assert Delivery.objects.get().attempts == 0  # given back, its attempt returned


@pytest.mark.django_db(transaction=True)
def test_no_request_starts_when_its_consumer_was_paused_while_its_host_was_looked_up(settings, monkeypatch):
    """A pause the pass sees while a row's host is looked up: that row's attempt has begun (it
    cannot be taken back from the loop), so the pause is asked again once the lookup ends, and
    no request goes out; the row is given back."""
    from outbox import service
    from outbox.models import Consumer
    from outbox.sweep import SweepPass

    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = True
    asked, release = slow_lookup(monkeypatch)
    seen = threading.Event()
    start_more = SweepPass.start_more

    def watched(self):
        start_more(self)
        if self.paused:
            seen.set()

    monkeypatch.setattr(SweepPass, "start_more", watched)
    with Peer() as server:
        consumer = WebhookConsumerFactory(
            url=f"http://slow.hooks.test:{server.port}/hooks", timeout_seconds=30
        )
        emit("passport.published", {"dppId": "abc"})
        sweeper, box = sweeping()
        assert asked.wait(10)
        service.pause(Consumer.objects.get(pk=consumer.pk), actor="ops", reason="maintenance")
        assert seen.wait(10)  # (the pass re-reads its consumers every REFRESH_SECONDS)
        release.set()
        sweeper.join(20)
    assert not sweeper.is_alive()
    assert server.seen == [], "a request started after its consumer's pause, seen during the lookup"
    assert box["report"].not_started == 1 and box["report"].delivered == 0
    assert Delivery.objects.get().attempts == 0  # given back, its attempt returned


@pytest.mark.parametrize("port", [0, 65536, 70000])
def test_a_port_out_of_range_is_refused_not_wrapped(port):
    """httpx reads port 70000 as 70000 and the connection went to 70000 - 65536 (4464), while the
    Host header named 70000: refused when stored and when sent."""
    with pytest.raises(Refused, match="port must be from 1 to 65535"):
        consumers.check_webhook_url(f"http://127.0.0.1:{port}/hooks")


def create_by_api(api_as, admin_client):
    answer = api_as("admin").post(
        "outbox/consumers",
        {
            "name": "slow-hooks",
            "kind": "webhook",
            "url": "https://slow.hooks.test/hooks",
            "eventTypes": ["*"],
        },
    )
    return answer.status_code, answer.json()


def change_by_api(api_as, admin_client):
    answer = api_as("admin").patch("outbox/consumers/erp", {"url": "https://slow.hooks.test/hooks"})
    return answer.status_code, answer.json()


def add_in_the_admin(api_as, admin_client):
    page = admin_client.post(
        "/admin/outbox/consumer/add/",
        {"name": "slow-hooks", "kind": "webhook", "url": "https://slow.hooks.test/hooks", "target": "",
         "event_types": '["*"]', "max_attempts": 5, "timeout_seconds": 5},
    )  # fmt: skip
    return page.status_code, page.content.decode()


@pytest.mark.parametrize("store", [create_by_api, change_by_api, add_in_the_admin], ids=lambda f: f.__name__)
@pytest.mark.django_db(transaction=True)  # (the request runs on a thread of its own, with its connection)
def test_a_webhook_url_whose_host_lookup_hangs_is_answered_within_its_deadline(
    store, api_as, admin_client, settings, monkeypatch
):
    """Storing a webhook URL looks its host up (the address rule): a resolver that hangs held the
    request, and its web worker, for as long as it hung. The lookup now has URL_LOOKUP_SECONDS: then
    503 host_lookup_timeout (the admin's form says why), and nothing is stored."""
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = False  # (production's rule: only then is the host looked up)
    monkeypatch.setattr(consumers, "URL_LOOKUP_SECONDS", 0.5, raising=False)  # (the code before had none)
    WebhookConsumerFactory(name="erp", url="https://erp.example.eu/hooks")
    asked, release = slow_lookup(monkeypatch)
    box = {}

    def request():
        started = time.monotonic()
        try:
            box["answer"] = store(api_as, admin_client)
        finally:
            box["seconds"] = time.monotonic() - started
            from django.db import connections

            connections.close_all()

    storing = threading.Thread(target=request, daemon=True)
    try:
        storing.start()
        assert asked.wait(10), "the host was not looked up"
        storing.join(5)
        assert not storing.is_alive(), "the request still waits for a lookup that hangs"
    finally:
        release.set()
        storing.join(10)
    status, body = box["answer"]
    if store is add_in_the_admin:
        assert status == 200 and "did not resolve within 0.5 s" in body  # the form again, saying why
    else:
        assert (status, body["code"]) == (503, "host_lookup_timeout"), body
        assert body["detail"].startswith("The webhook host slow.hooks.test did not resolve within 0.5 s")
    assert box["seconds"] < 3
    from outbox.models import Consumer

    assert list(Consumer.objects.values_list("name", "url")) == [("erp", "https://erp.example.eu/hooks")]
