"""One address rule for every webhook target (odal.core.addresses), asked when a URL is stored and again
when connecting (the pin): an IPv6 address that carries an IPv4 address is judged by that IPv4
address; multicast, site-local, unspecified, broadcast and reserved addresses are refused.

On an IPv6-only host with NAT64, [64:ff9b::a9fe:a9fe] is 169.254.169.254, a cloud's metadata
service: Python's `is_global` calls it global, as it does multicast and site-local addresses.

Network rule: nothing here connects. Names are answered by a scripted resolver and connections go
to a network that records them and connects nowhere (test_webhook_pinning's Wire)."""

import ipaddress

import pytest

from outbox.models import Consumer
from tests.factories import WebhookConsumerFactory
from tests.test_webhook_pinning import Resolver, sent

pytestmark = pytest.mark.django_db

# address, the IPv4 address it is judged by (or None), and what the refusal calls it
REFUSED = [
    ("64:ff9b::a9fe:a9fe", "169.254.169.254", "NAT64, 64:ff9b::/96"),
    ("64:ff9b::a00:1", "10.0.0.1", "NAT64, 64:ff9b::/96"),
    ("64:ff9b:1::a00:1", "10.0.0.1", "NAT64, 64:ff9b:1::/48"),
    ("64:ff9b:1:1:a:0:108:808", "10.0.0.1", "NAT64, 64:ff9b:1::/48"),  # read with a /64 prefix (/96: 1.8.8.8)
    ("2002:7f00:1::", "127.0.0.1", "6to4, 2002::/16"),
    ("2002:a9fe:a9fe::1", "169.254.169.254", "6to4, 2002::/16"),
    ("::7f00:1", "127.0.0.1", "IPv4-compatible, ::/96"),
    ("::ffff:0:a9fe:a9fe", "169.254.169.254", "SIIT, ::ffff:0:0:0/96"),
    ("::ffff:127.0.0.1", "127.0.0.1", "IPv4-mapped, ::ffff:0:0/96"),
    ("::ffff:10.0.0.8", "10.0.0.8", "IPv4-mapped, ::ffff:0:0/96"),
    # Teredo: server 65.54.227.120, client 192.0.2.45 (documentation: not a host)
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "192.0.2.45", "Teredo, 2001::/32"),
    ("fec0::1", None, "a site-local address"),
    ("224.0.0.1", None, "a multicast address"),
    ("ff02::1", None, "a multicast address"),
    ("ff0e::1", None, "a multicast address"),
    ("0.0.0.0", None, "the unspecified address"),
    ("::", None, "the unspecified address"),
    ("255.255.255.255", None, "the broadcast address"),
    ("240.0.0.1", None, "an internal address"),  # reserved, and not global
    ("4000::1", None, "a reserved address"),
    ("100.64.0.1", None, "an internal address"),
    ("::1", None, "an internal address"),
    # Ranges Python's ipaddress calls global (issue 37): RFC 9637's documentation prefix and the
    # retired 6to4 relay anycast range (RFC 7526), also as 6to4 and NAT64 carry it.
    ("3fff::1", None, "a documentation address (3fff::/20, RFC 9637)"),
    ("3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", None, "a documentation address (3fff::/20, RFC 9637)"),
    ("192.88.99.1", None, "the retired 6to4 relay anycast range (192.88.99.0/24, RFC 7526)"),
    ("192.88.99.255", None, "the retired 6to4 relay anycast range (192.88.99.0/24, RFC 7526)"),
    ("2002:c058:6301::1", "192.88.99.1", "6to4, 2002::/16"),
    ("64:ff9b::c058:6301", "192.88.99.1", "NAT64, 64:ff9b::/96"),
]
# public counterparts: the same mechanisms carrying a public IPv4 address stay allowed
ALLOWED = [
    "64:ff9b::808:808",  # 8.8.8.8 through NAT64
    "64:ff9b:1:808:8:808:808:808",  # 8.8.8.8 whatever the prefix length of the local NAT64
    "2002:808:808::1",  # 6to4
    "::808:808",  # IPv4-compatible
    "::ffff:0:808:808",  # SIIT
    "::ffff:8.8.8.8",  # IPv4-mapped
    "2001:0:4136:e378:8000:63bf:f7f7:f7f7",  # Teredo, client 8.8.8.8
    "8.8.8.8",
    "2606:4700:4700::1111",
    "3fff:1000::1",  # just past 3fff::/20
    "192.88.98.255",  # just before 192.88.99.0/24
    "192.88.100.0",  # just past it
]


def url_of(address: str) -> str:
    return f"http://[{address}]/hooks" if ":" in address else f"http://{address}/hooks"


def refusal(address: str, ipv4: str | None, what: str) -> str:
    address = str(ipaddress.ip_address(address))  # as odal writes it: ::ffff:127.0.0.1 is ::ffff:7f00:1
    if ipv4 is None:
        return f"resolves to {address}, {what};"
    return f"resolves to {address}, which carries the IPv4 address {ipv4} ({what}), "


def ids(table):
    return [row[0] if isinstance(row, tuple) else row for row in table]


@pytest.fixture
def production(settings):
    settings.ODAL_ALLOW_PRIVATE_WEBHOOKS = False


# -- when stored -------------------------------------------------------------------------------------


@pytest.mark.parametrize("address, ipv4, what", REFUSED, ids=ids(REFUSED))
def test_an_address_that_is_not_public_is_refused_when_stored(api_as, production, address, ipv4, what):
    response = api_as("admin").post(
        "outbox/consumers", {"name": "x", "kind": "webhook", "url": url_of(address)}
    )
    print(response.status_code, response.json())
    assert response.status_code == 422
    assert response.json()["code"] == "private_webhook_target"
    assert refusal(address, ipv4, what) in response.json()["detail"]
    assert not Consumer.objects.exists()


@pytest.mark.parametrize("address", ALLOWED, ids=ids(ALLOWED))
def test_a_public_address_is_stored(api_as, production, address):
    response = api_as("admin").post(
        "outbox/consumers", {"name": "x", "kind": "webhook", "url": url_of(address)}
    )
    assert response.status_code == 201, response.json()
    assert Consumer.objects.get().url == url_of(address)


# -- when connecting ---------------------------------------------------------------------------------


@pytest.fixture
def resolver(monkeypatch):
    def install(scripts):
        fake = Resolver(scripts)
        monkeypatch.setattr("socket.getaddrinfo", fake)
        return fake

    return install


@pytest.mark.parametrize("address, ipv4, what", REFUSED, ids=ids(REFUSED))
def test_a_name_that_resolves_to_an_address_that_is_not_public_is_not_connected_to(
    production, resolver, address, ipv4, what
):
    """Stored while the name was public (the factory stores it unchecked); it now resolves to
    `address`: the pin refuses it before any connection."""
    resolver({"hooks.example.com": [[address]]})
    (outcome,), wire = sent(WebhookConsumerFactory(url="https://hooks.example.com/hooks"))
    print(outcome.error, [(line.address, line.port) for line in wire.lines])
    assert wire.lines == []
    assert outcome.error.startswith(f"not called: hooks.example.com {refusal(address, ipv4, what)}")


@pytest.mark.parametrize("address", ALLOWED, ids=ids(ALLOWED))
def test_a_name_that_resolves_to_a_public_address_is_connected_to_there(production, resolver, address):
    resolver({"hooks.example.com": [[address]]})
    (outcome,), wire = sent(WebhookConsumerFactory(url="https://hooks.example.com/hooks"))
    assert outcome.ok, outcome.error
    assert [(line.address, line.port) for line in wire.lines] == [(str(ipaddress.ip_address(address)), 443)]
