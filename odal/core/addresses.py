"""The one rule for the addresses odal connects out to (webhooks): a public unicast host or nothing.

It is asked when a target is stored and again when connecting (the pin: outbox.consumers), so
what was refused when configured is refused when it would be reached, whatever a name resolves
to by then.

An IPv6 address that carries an IPv4 address is judged by that IPv4 address: a NAT64 gateway, a
6to4 relay or a dual stack delivers it there, so 64:ff9b::a9fe:a9fe is 169.254.169.254 (a cloud's
metadata service) for any host with NAT64, while 64:ff9b::808:808 is 8.8.8.8 and public. Python's
`is_global` alone calls the first global (and multicast and site-local addresses too).
"""

import ipaddress

IPv4 = ipaddress.IPv4Address
IPv6 = ipaddress.IPv6Address

NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052's well-known prefix
NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215: a prefix of the network's own choosing
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # RFC 4291, deprecated; :: and ::1 are IPv6's own
SIIT = ipaddress.IPv6Network("::ffff:0:0:0/96")  # RFC 2765's IPv4-translated addresses
# Ranges that are no host's, which Python's `is_global` still calls global (its tables predate them).
NO_HOSTS = [
    (ipaddress.IPv6Network("3fff::/20"), "a documentation address (3fff::/20, RFC 9637)"),
    (
        ipaddress.IPv4Network("192.88.99.0/24"),
        "the retired 6to4 relay anycast range (192.88.99.0/24, RFC 7526)",
    ),
]


def _ipv4(bits: int) -> IPv4:
    return IPv4(bits & 0xFFFFFFFF)


def _local_nat64(address: IPv6) -> list[IPv4]:
    """The IPv4 addresses an address of 64:ff9b:1::/48 may carry. Which one depends on the length
    of the prefix the network's translator uses inside the block (RFC 6052: /48, /56, /64 or
    /96; bits 64-71 are skipped), which odal cannot know: every reading is judged."""
    n = int(address)
    octet = lambda at: (n >> (120 - at)) & 0xFF  # noqa: E731 (the octet starting at bit `at`)
    # Where the four octets start, for a prefix of /96 (the usual carve-out first), /64, /56 and /48.
    readings = [(96, 104, 112, 120), (72, 80, 88, 96), (56, 72, 80, 88), (48, 56, 72, 80)]
    return [IPv4(bytes(octet(at) for at in starts)) for starts in readings]


def carried_ipv4(address: IPv6) -> tuple[list[IPv4], str] | None:
    """The IPv4 addresses `address` carries, and how (for the refusal's sentence); None if none."""
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped], "IPv4-mapped, ::ffff:0:0/96"
    if address in SIIT:
        return [_ipv4(int(address))], "SIIT, ::ffff:0:0:0/96"
    if address in NAT64:
        return [_ipv4(int(address))], "NAT64, 64:ff9b::/96"
    if address in NAT64_LOCAL:
        return _local_nat64(address), "NAT64, 64:ff9b:1::/48"
    if address.sixtofour is not None:
        return [address.sixtofour], "6to4, 2002::/16"
    if address.teredo is not None:
        server, client = address.teredo
        return [server, client], "Teredo, 2001::/32"
    if address in IPV4_COMPATIBLE and int(address) > 1:  # :: and ::1 are judged as IPv6
        return [_ipv4(int(address))], "IPv4-compatible, ::/96"
    return None


def _unicast_problem(address: IPv4 | IPv6) -> str | None:
    if address.is_multicast:
        return "a multicast address"
    if isinstance(address, IPv6) and address.is_site_local:
        return "a site-local address"
    if address.is_unspecified:
        return "the unspecified address"
    if isinstance(address, IPv4) and address == IPv4("255.255.255.255"):
        return "the broadcast address"
    for network, what in NO_HOSTS:
        if address in network:  # (an address of the other version is in no network of this one)
            return what
    if not address.is_global:  # loopback, private, link-local, shared (CGNAT), documentation...
        return "an internal address"
    if address.is_reserved:  # (of IPv4's, 240.0.0.0/4 is not global either)
        return "a reserved address"
    return None


def why_not_public(address: IPv4 | IPv6) -> str | None:
    """Why odal may not connect to `address`, as a phrase ("an internal address"), or None when
    it is a public unicast address. Refused: loopback, private, link-local, shared (CGNAT),
    documentation (3fff::/20 too) and benchmarking ranges, the retired 6to4 relay anycast range,
    multicast, site-local, unspecified, broadcast and reserved addresses, and any IPv6 address that
    carries an IPv4 address refused here."""
    carried = carried_ipv4(address) if isinstance(address, IPv6) else None
    if carried is None:
        return _unicast_problem(address)
    ipv4s, how = carried
    for ipv4 in ipv4s:
        problem = _unicast_problem(ipv4)
        if problem is not None:
            return f"which carries the IPv4 address {ipv4} ({how}), {problem}"
    return None
