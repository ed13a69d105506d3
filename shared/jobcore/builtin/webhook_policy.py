"""Which addresses a webhook may be sent to: public unicast only, judged on addresses.

Pure functions, standard library only. Every numeric host form and every name
is reduced to the IP addresses it denotes before it is judged
(`parse_ip_literal`, `is_local_name`), and `is_forbidden` refuses anything the
standard library does not call global, plus the ranges its tables miss or
disagree about between Python versions.
"""

from __future__ import annotations

import ipaddress
import re

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Not public destinations, whatever this Python's `is_global` says: its tables differ
# between versions and predate some assignments.
_NOT_PUBLIC = tuple(
    ipaddress.ip_network(net)
    for net in (
        "0.0.0.0/8",  # "this network"
        "100.64.0.0/10",  # carrier-grade NAT (shared address space)
        "192.0.0.0/24",  # IETF protocol assignments (anycast services included)
        "192.88.99.0/24",  # the deprecated 6to4 relay anycast
        "198.18.0.0/15",  # benchmarking
        "240.0.0.0/4",  # reserved, and the limited broadcast address
        "2001::/23",  # IETF protocol assignments: Teredo, benchmarking, ORCHID, AMT, AS112
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation (RFC 9637)
        "64:ff9b:1::/48",  # local-use NAT64 (RFC 8215)
    )
)
_V4_NOT_PUBLIC = tuple(n for n in _NOT_PUBLIC if isinstance(n, ipaddress.IPv4Network))
_V6_NOT_PUBLIC = tuple(n for n in _NOT_PUBLIC if isinstance(n, ipaddress.IPv6Network))
# IPv6 global unicast is 2000::/3 (RFC 4291): everything else is reserved, unique or
# site-local (fec0::/10, which `is_global` accepts), link-local or multicast.
_V6_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

_NUMERIC_PART = re.compile(r"0[xX][0-9a-fA-F]*|[0-9]+")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv4-mapped, -compatible, 6to4 or NAT64 address leads to."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if int(ip) >> 32 == 0:  # ::a.b.c.d, the deprecated IPv4-compatible form (and :: and ::1)
        return ipaddress.IPv4Address(int(ip))
    return None


def is_forbidden(ip: IPAddress) -> bool:
    """True unless `ip` is a public unicast address."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return True
        inner = embedded_ipv4(ip)
        if inner is not None:
            return is_forbidden(inner)
        if ip not in _V6_GLOBAL_UNICAST or ip.is_site_local:
            return True
        if any(ip in net for net in _V6_NOT_PUBLIC):
            return True
    elif any(ip in net for net in _V4_NOT_PUBLIC):
        return True
    return (
        not ip.is_global
        or ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


def parse_ip_literal(host: str) -> IPAddress | None:
    """The address a numeric host denotes, in any form a resolver accepts; None for a name.

    Covers IPv6 (bracketed or not) and the inet_aton IPv4 forms: one to four
    dot-separated parts, each decimal, octal (leading 0) or hex (0x), the last
    part filling the remaining bytes (`2130706433`, `0x7f.1`, `017700000001`).
    Raises ValueError for a host that is numeric but denotes no address.
    """
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if ":" in text:
        try:
            return ipaddress.IPv6Address(text)
        except ValueError:
            raise ValueError(f"{host!r} is not a valid IPv6 address") from None
    text = text.removesuffix(".")
    parts = text.split(".")
    if not _NUMERIC_PART.fullmatch(parts[-1]):
        return None  # a name: its last label is not a number
    if len(parts) > 4 or not all(_NUMERIC_PART.fullmatch(p) for p in parts):
        raise ValueError(f"{host!r} is neither a host name nor an IPv4 address")
    numbers = [_parse_number(p) for p in parts]
    *head, last = numbers
    if any(n > 0xFF for n in head) or last >= 256 ** (5 - len(numbers)):
        raise ValueError(f"{host!r} is out of range for an IPv4 address")
    value = last
    for index, number in enumerate(head):
        value |= number << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def _parse_number(part: str) -> int:
    if part[:2].lower() == "0x":
        return int(part[2:] or "0", 16)
    if len(part) > 1 and part.startswith("0"):
        if not set(part) <= set("01234567"):
            raise ValueError(f"{part!r} is not an octal number")
        return int(part, 8)
    return int(part)


def is_local_name(host: str) -> bool:
    """`localhost` and its subdomains name this machine whatever DNS says (RFC 6761)."""
    name = host.lower().rstrip(".")
    return name == "localhost" or name.endswith(".localhost")
