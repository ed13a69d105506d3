"""The webhook address policy, as pure functions: numeric host forms and forbidden ranges."""

from __future__ import annotations

import ipaddress

import pytest

from jobcore.builtin.webhook_policy import (
    embedded_ipv4,
    is_forbidden,
    is_local_name,
    parse_ip_literal,
)

LOOPBACK = ipaddress.IPv4Address("127.0.0.1")


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "2130706433",
        "0x7f000001",
        "0x7f.1",
        "0x7F.0.0.1",
        "017700000001",
        "0177.1",
        "127.1",
        "127.0.1",
        "127.0.0.1.",
    ],
)
def test_every_numeric_spelling_of_loopback_parses_to_127_0_0_1(host):
    assert parse_ip_literal(host) == LOOPBACK


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
        ("0", "0.0.0.0"),
        ("1.0x100", "1.0.1.0"),
        ("8.8.8.8", "8.8.8.8"),
    ],
)
def test_ip_literals_parse_to_the_address_a_resolver_would_use(host, address):
    assert parse_ip_literal(host) == ipaddress.ip_address(address)


@pytest.mark.parametrize(
    "host", ["example.com", "hooks.example", "localhost", "1e3", "0x7g", "7f.example"]
)
def test_names_are_not_ip_literals(host):
    assert parse_ip_literal(host) is None


@pytest.mark.parametrize(
    "host",
    ["256.0.0.1", "1.2.3.4.5", "08", "1.2.3.0400", "4294967296", "example.123", "0x7g.1", "[::1"],
)
def test_numeric_hosts_that_denote_no_address_are_rejected(host):
    with pytest.raises(ValueError):
        parse_ip_literal(host)


FORBIDDEN = {
    "IPv4 loopback": "127.0.0.1",
    "IPv4 loopback, elsewhere in 127/8": "127.255.1.2",
    "10/8": "10.0.0.1",
    "172.16/12": "172.16.0.1",
    "172.16/12, upper end": "172.31.255.254",
    "192.168/16": "192.168.1.1",
    "cloud metadata, link-local": "169.254.169.254",
    "shared address space 100.64/10": "100.64.0.1",
    "shared address space, upper end": "100.127.255.254",
    "multicast": "224.0.0.1",
    "multicast, admin scope": "239.255.255.250",
    "unspecified": "0.0.0.0",
    "this network 0/8": "0.1.2.3",
    "240/4 reserved": "240.0.0.1",
    "broadcast": "255.255.255.255",
    "documentation": "192.0.2.1",
    "IPv6 loopback": "::1",
    "IPv6 unspecified": "::",
    "IPv6 link-local fe80::/10": "fe80::1",
    "IPv6 unique local fc00::/7": "fd12:3456::1",
    "IPv6 unique local, fc half": "fc00::1",
    "IPv6 multicast ff00::/8": "ff02::1",
    "IPv6 global-scope multicast": "ff0e::1",
    "IPv4-mapped loopback": "::ffff:127.0.0.1",
    "IPv4-mapped private": "::ffff:10.0.0.1",
    "IPv4-mapped metadata": "::ffff:169.254.169.254",
    "IPv4-compatible loopback": "::127.0.0.1",
    "IPv4-translated loopback": "::ffff:0:127.0.0.1",
    "NAT64 loopback": "64:ff9b::7f00:1",
    "NAT64 private": "64:ff9b::a00:1",
    "local-use NAT64": "64:ff9b:1::808:808",
    "6to4 of loopback": "2002:7f00:1::1",
    "6to4 of private": "2002:c0a8:101::1",
    "Teredo": "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    "IPv6 documentation": "2001:db8::1",
    "IPv6 documentation 3fff::/20 (RFC 9637)": "3fff::1",
    "IPv6 documentation 3fff::/20, upper end": "3fff:fff:ffff::1",
    "IPv6 site-local fec0::/10 (deprecated)": "fec0::1",
    "IPv6 site-local, upper end": "feff:ffff::1",
    "IPv6 discard-only 100::/64": "100::1",
    "IPv6 benchmarking 2001:2::/48": "2001:2::1",
    "IPv6 ORCHIDv2": "2001:20::1",
    "IPv6 IETF protocol assignment (AMT)": "2001:3::1",
    "IPv6 SRv6 SIDs 5f00::/16": "5f00::1",
    "IPv6 reserved 4000::/3": "4000::1",
    "IPv6 reserved below 2000::/3": "1fff::1",
    "IPv6 with a zone": "fe80::1%eth0",
    "NAT64 of private (dotted)": "64:ff9b::10.0.0.1",
    "NAT64 of shared 100.64/10": "64:ff9b::100.64.0.1",
    "6to4 of 10.0.0.1": "2002:0a00:0001::",
    "6to4 of shared 100.64/10": "2002:6440:1::1",
    "IPv4-translated private": "::ffff:0:10.0.0.1",
    "IPv4-compatible private": "::10.0.0.1",
    "IETF protocol assignments 192.0.0/24": "192.0.0.1",
    "PCP anycast 192.0.0.9 (global to newer Pythons)": "192.0.0.9",
    "TURN anycast 192.0.0.10": "192.0.0.10",
    "benchmarking 198.18/15": "198.18.0.1",
    "benchmarking, upper end": "198.19.255.254",
    "deprecated 6to4 relay anycast": "192.88.99.1",
    "documentation TEST-NET-2": "198.51.100.1",
    "documentation TEST-NET-3": "203.0.113.1",
    "240/4, upper end": "255.255.255.254",
}


@pytest.mark.parametrize("address", FORBIDDEN.values(), ids=FORBIDDEN.keys())
def test_non_public_addresses_are_forbidden(address):
    assert is_forbidden(ipaddress.ip_address(address))


PUBLIC = {
    "IPv4": "8.8.8.8",
    "IPv4 next to 100.64/10": "100.128.0.1",
    "IPv4 next to 172.16/12": "172.32.0.1",
    "IPv6": "2606:4700:4700::1111",
    "IPv4-mapped public": "::ffff:8.8.8.8",
    "NAT64 public": "64:ff9b::808:808",
    "6to4 public": "2002:808:808::1",
    "IPv6 next to 3fff::/20": "3fff:1000::1",
    "IPv6 next to 2001:db8::/32": "2001:db9::1",
    "IPv6 next to 2001::/23": "2001:200::1",
    "IPv4 next to 192.0.0/24": "192.0.1.1",
    "IPv4 next to 198.18/15": "198.20.0.1",
}


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("167772161", "10.0.0.1"),
        ("012.0.0.1", "10.0.0.1"),
        ("0xa000001", "10.0.0.1"),
        ("0xa.0.0.1", "10.0.0.1"),
        ("10.1", "10.0.0.1"),
        ("3232235521", "192.168.0.1"),
        ("0300.0250.0.1", "192.168.0.1"),
        ("0xc0.0xa8.1", "192.168.0.1"),
        ("2886729729", "172.16.0.1"),
        ("0xa9fea9fe", "169.254.169.254"),
        ("100.0x400001", "100.64.0.1"),
        ("0", "0.0.0.0"),
        ("0x0", "0.0.0.0"),
        ("[::ffff:a00:1]", "::ffff:10.0.0.1"),
        ("[64:ff9b::a00:1]", "64:ff9b::10.0.0.1"),
        ("[fec0::1]", "fec0::1"),
        ("[3fff::1]", "3fff::1"),
    ],
)
def test_numeric_spellings_of_non_public_addresses_parse_to_a_forbidden_address(host, address):
    ip = parse_ip_literal(host)
    assert ip == ipaddress.ip_address(address)
    assert ip is not None and is_forbidden(ip)


@pytest.mark.parametrize("address", PUBLIC.values(), ids=PUBLIC.keys())
def test_public_unicast_addresses_are_allowed(address):
    assert not is_forbidden(ipaddress.ip_address(address))


def test_ipv6_transition_forms_lead_to_their_ipv4_address():
    ip = ipaddress.IPv6Address
    assert embedded_ipv4(ip("::ffff:10.0.0.1")) == ipaddress.IPv4Address("10.0.0.1")
    assert embedded_ipv4(ip("64:ff9b::7f00:1")) == LOOPBACK
    assert embedded_ipv4(ip("2002:7f00:1::1")) == LOOPBACK
    assert embedded_ipv4(ip("::127.0.0.1")) == LOOPBACK
    assert embedded_ipv4(ip("2606:4700::1")) is None


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST", "localhost.", "api.localhost"])
def test_localhost_names_this_machine_whatever_dns_says(host):
    assert is_local_name(host)


@pytest.mark.parametrize("host", ["localhost.example.com", "notlocalhost", "example.com"])
def test_other_names_are_not_local_by_spelling(host):
    assert not is_local_name(host)
