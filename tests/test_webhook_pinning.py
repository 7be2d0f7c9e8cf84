"""Webhook targets are pinned: the request connects to exactly the address that was checked, while
it still names the consumer's host (Host header; for https the TLS server name and the name the
certificate is verified against). A second lookup when connecting could answer otherwise: a
rebinding DNS server answers the check with a public address and the connection with an
internal one.

Network rule of these tests: no traffic leaves 127.0.0.0/8. Names are answered by a scripted
resolver; public addresses appear only where an httpx.MockTransport answers (no connection)."""

import ipaddress
import shutil
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from outbox import consumers
from outbox.events import emit
from outbox.models import Delivery
from outbox.sweep import sweep_once
from tests.factories import WebhookConsumerFactory
from tests.webhook_server import WebhookServer

pytestmark = pytest.mark.django_db

REBIND = "hooks.rebind.test"
real_getaddrinfo = socket.getaddrinfo


@pytest.fixture(autouse=True)
def _no_backoff(settings):
    settings.ODAL_BACKOFF_BASE_SECONDS = 0


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
    connection, Host header and (TLS) server name."""

    def __init__(self, address="127.0.0.1", port=0, tls: ssl.SSLContext | None = None):
        self.seen: list[Seen] = []
        peer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length") or 0))
                name = getattr(self.connection, "server_name", None)
                peer.seen.append(Seen(self.client_address[1], self.headers.get("host"), name))
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # a client that refused our certificate hung up: no news

        self.httpd = Server((address, port), Handler)
        if tls is not None:
            tls.sni_callback = lambda sock, name, context: setattr(sock, "server_name", name)
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def deliver(consumer, client: httpx.Client) -> consumers.Outcome:
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
        with httpx.Client() as client:
            outcome = deliver(consumer, client)
    assert server.seen == []
    assert not outcome.ok and outcome.error.startswith(
        f"not called: {REBIND} resolves to 127.0.0.1, an internal address"
    )


def test_plain_http_connections_are_still_pooled_across_pinned_requests(resolver):
    """Two names at one address: one kept-alive connection carries all their requests, each
    with its own Host header (plain HTTP: the Host header is all that names the site)."""
    with Peer() as server, httpx.Client() as client:
        resolver({"a.hooks.test": [["127.0.0.1"]], "b.hooks.test": [["127.0.0.1"]]})
        a = WebhookConsumerFactory(name="a", url=f"http://a.hooks.test:{server.port}/hooks")
        b = WebhookConsumerFactory(name="b", url=f"http://b.hooks.test:{server.port}/hooks")
        outcomes = [deliver(a, client), deliver(b, client), deliver(a, client)]
    assert all(outcome.ok for outcome in outcomes), outcomes
    assert [seen.host for seen in server.seen] == [
        f"a.hooks.test:{server.port}",
        f"b.hooks.test:{server.port}",
        f"a.hooks.test:{server.port}",
    ]
    assert len({seen.client_port for seen in server.seen}) == 1


# -- TLS: connected to the address, verified for the name -----------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for a.hooks.test only (no IP address in it)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=a.hooks.test",
         "-addext", "subjectAltName=DNS:a.hooks.test"],
        check=True, capture_output=True,
    )  # fmt: skip
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))


def test_https_connects_to_the_address_and_verifies_the_name(resolver, certificate):
    """The certificate names a.hooks.test and no address: the TLS handshake must send that name
    (SNI) and check the certificate against it, though the connection goes to 127.0.0.1."""
    server_tls, trusted = certificate
    with Peer(tls=server_tls) as server, httpx.Client(verify=trusted) as client:
        dns = resolver({"a.hooks.test": [["127.0.0.1"], ["127.0.0.2"]]})
        consumer = WebhookConsumerFactory(url=f"https://a.hooks.test:{server.port}/hooks")
        outcome = deliver(consumer, client)
    assert outcome.ok, outcome.error
    assert server.seen == [Seen(server.seen[0].client_port, f"a.hooks.test:{server.port}", "a.hooks.test")]
    assert dns.of("a.hooks.test") == ["a.hooks.test"]


def test_a_tls_connection_verified_for_one_name_does_not_carry_another_names_request(resolver, certificate):
    """b.hooks.test is at the same address as a.hooks.test but the server has no certificate for
    it: b's request must fail its own certificate check, not ride a kept-alive connection that
    was verified for a (connections are pooled by address, not by server name)."""
    server_tls, trusted = certificate
    with Peer(tls=server_tls) as server, httpx.Client(verify=trusted) as client:
        resolver({"a.hooks.test": [["127.0.0.1"]], "b.hooks.test": [["127.0.0.1"]]})
        a = WebhookConsumerFactory(name="a", url=f"https://a.hooks.test:{server.port}/hooks")
        b = WebhookConsumerFactory(name="b", url=f"https://b.hooks.test:{server.port}/hooks")
        first, second = deliver(a, client), deliver(b, client)
    assert first.ok, first.error
    assert not second.ok and "CERTIFICATE_VERIFY_FAILED" in second.error, second.error
    assert [seen.host for seen in server.seen] == [f"a.hooks.test:{server.port}"]


# -- what the request says, without a connection (httpx.MockTransport) ----------------------------


def sent(consumer) -> tuple[consumers.Outcome, list[httpx.Request]]:
    requests = []

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(204, content=iter([b""]))  # a stream, as from a connection

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        return deliver(consumer, client), requests


@pytest.mark.parametrize(
    "answer, url, host, server_name",
    [
        (["93.184.215.14"], "https://93.184.215.14:8443/hooks?x=1", "hooks.example.com:8443", "hooks.example.com"),
        # several addresses: the first (the resolver's order) is connected to
        (["2606:2800:21f:cb07:6820:80da:af6b:8b2c", "93.184.215.14"],
         "https://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:8443/hooks?x=1", "hooks.example.com:8443",
         "hooks.example.com"),
    ],
    ids=["ipv4", "ipv6_first_of_several"],
)  # fmt: skip
def test_in_production_the_request_goes_to_the_checked_address_in_the_name_of_the_host(
    settings, resolver, answer, url, host, server_name
):
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = False
    # a second lookup would answer an internal address: it must never be made
    dns = resolver({"hooks.example.com": [answer, ["127.0.0.1"]]})
    consumer = WebhookConsumerFactory(url="https://hooks.example.com:8443/hooks?x=1")
    outcome, requests = sent(consumer)
    assert outcome.ok, outcome.error
    (request,) = requests
    assert str(request.url) == url
    assert request.headers["host"] == host
    assert request.extensions["sni_hostname"] == server_name
    assert request.headers["connection"] == "close"  # a pinned TLS connection serves one request
    assert dns.lookups == ["hooks.example.com"]


def test_an_ipv6_literal_is_connected_to_as_it_is(settings, resolver):
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = False
    dns = resolver({})
    outcome, requests = sent(WebhookConsumerFactory(url="https://[2606:4700:4700::1111]/hooks"))
    assert outcome.ok, outcome.error
    (request,) = requests
    assert str(request.url) == "https://[2606:4700:4700::1111]/hooks"
    assert request.headers["host"] == "[2606:4700:4700::1111]"
    assert request.extensions["sni_hostname"] == "2606:4700:4700::1111"
    assert dns.lookups == []


def test_plain_http_names_the_host_and_keeps_alive(settings, resolver):
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = False
    resolver({"hooks.example.com": [["93.184.215.14"]]})
    outcome, requests = sent(WebhookConsumerFactory(url="http://hooks.example.com/hooks"))
    assert outcome.ok, outcome.error
    (request,) = requests
    assert str(request.url) == "http://93.184.215.14/hooks"
    assert request.headers["host"] == "hooks.example.com"
    assert "sni_hostname" not in request.extensions
    assert request.headers["connection"] == "keep-alive"  # httpx's own default


@pytest.mark.parametrize(
    "answer, internal",
    [(["93.184.215.14", "10.0.0.8"], "10.0.0.8"), (["2606:4700:4700::1111", "::1"], "::1")],
    ids=["ipv4", "ipv6"],
)
def test_in_production_a_name_with_any_internal_address_is_not_called(settings, resolver, answer, internal):
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = False
    resolver({"hooks.example.com": [answer]})
    outcome, requests = sent(WebhookConsumerFactory(url="https://hooks.example.com/hooks"))
    assert requests == []
    assert outcome.error.startswith(
        f"not called: hooks.example.com resolves to {internal}, an internal address"
    )


def test_a_name_that_does_not_resolve_is_not_called(resolver):
    resolver({"gone.hooks.test": [[]]})
    outcome, requests = sent(WebhookConsumerFactory(url="http://gone.hooks.test/hooks"))
    assert requests == []
    assert outcome.error == "not called: The webhook host gone.hooks.test does not resolve."
