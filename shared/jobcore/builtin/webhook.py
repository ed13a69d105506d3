"""The `webhook` handler: POSTs a JSON body to a URL, refusing private destinations.

The address policy (`parse_ip_literal`, `is_forbidden`, `is_local_name`) is pure
and decides on addresses, never on spellings: every numeric host form and every
name is reduced to the IP addresses it denotes before it is judged. The host is
resolved once; the request then goes to the address that was checked, with the
original `Host` header and TLS server name, so DNS cannot answer differently
between the check and the connection.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobcore.errors import PermanentError
from jobcore.registry import JobContext, handler

if TYPE_CHECKING:
    import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

CONNECT_TIMEOUT = 10.0
TIMEOUT = 30.0

# 100.64.0.0/10 (carrier-grade NAT) is neither private nor global to `ipaddress`;
# 64:ff9b:1::/48 is the local-use NAT64 prefix (RFC 8215).
_EXTRA_FORBIDDEN = (
    ipaddress.ip_network("100.64.0.0/10"),
    ipaddress.ip_network("64:ff9b:1::/48"),
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

# Headers that frame the request or that the handler owns.
_RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "idempotency-key"}
)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e]*")
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
    return (
        not ip.is_global
        or ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or any(ip in net for net in _EXTRA_FORBIDDEN if net.version == ip.version)
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


@dataclass(frozen=True)
class Delivery:
    """A validated webhook payload."""

    url: str
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def parse_payload(payload: Any) -> Delivery:
    """Validate the job payload; anything wrong with it is a PermanentError."""
    if not isinstance(payload, dict):
        raise PermanentError('payload must be an object like {"url": "https://…", "body": {}}')
    unknown = sorted(set(payload) - {"url", "body", "headers"})
    if unknown:
        raise PermanentError(f"unknown payload fields: {', '.join(unknown)}")
    url = payload.get("url")
    if not isinstance(url, str) or not url.strip():
        raise PermanentError("payload.url must be a non-empty string")
    headers = payload.get("headers", {})
    if headers is None:
        headers = {}
    if not isinstance(headers, dict):
        raise PermanentError("payload.headers must be an object of strings")
    for name, value in headers.items():
        if not isinstance(value, str):
            raise PermanentError(f"payload.headers[{name!r}] must be a string")
        if not _TOKEN.fullmatch(name):
            raise PermanentError(f"payload.headers: {name!r} is not a valid header name")
        if not _FIELD_VALUE.fullmatch(value):
            raise PermanentError(f"payload.headers[{name!r}] holds characters not allowed")
        if name.lower() in _RESERVED_HEADERS:
            raise PermanentError(f"payload.headers may not set {name}")
    return Delivery(url=url.strip(), body=payload.get("body"), headers=dict(headers))


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to, by the system resolver run off the event loop."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        ip = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if ip not in addresses:
            addresses.append(ip)
    return addresses


@handler("webhook")
async def webhook(payload: Any, ctx: JobContext) -> None:
    import httpx  # deferred: the API imports this module and never sends webhooks

    delivery = parse_payload(payload)
    try:
        url = httpx.URL(delivery.url)
    except httpx.InvalidURL as exc:
        raise PermanentError(f"payload.url is not a valid URL: {exc}") from None
    if url.scheme not in ("http", "https"):
        raise PermanentError("payload.url must use http or https")
    host = url.raw_host.decode("ascii")
    if not host:
        raise PermanentError("payload.url has no host")
    port = url.port if url.port is not None else (443 if url.scheme == "https" else 80)
    if not 0 < port < 65536:
        raise PermanentError(f"payload.url has an invalid port {port}")

    try:
        literal = parse_ip_literal(host)
    except ValueError as exc:
        raise PermanentError(f"payload.url: {exc}") from None
    if not ctx.webhook_allow_private and literal is None and is_local_name(host):
        raise PermanentError(f"refusing to send to {host}: it names this machine")
    if literal is not None:
        addresses: list[IPAddress] = [literal]
    else:
        try:
            addresses = await resolve(host, port)
        except OSError as exc:
            raise RuntimeError(f"cannot resolve {host}: {exc}") from None
        if not addresses:
            raise RuntimeError(f"cannot resolve {host}: no addresses")
    if not ctx.webhook_allow_private:
        forbidden = [str(ip) for ip in addresses if is_forbidden(ip)]
        if forbidden:
            raise PermanentError(
                f"refusing to send to {host}: it resolves to a non-public address "
                f"({', '.join(forbidden)}); set WEBHOOK_ALLOW_PRIVATE=true to allow"
            )

    headers = dict(delivery.headers)
    if not any(name.lower() == "content-type" for name in headers):
        headers["Content-Type"] = "application/json"
    headers["Host"] = url.netloc.decode("ascii")
    headers["Idempotency-Key"] = str(ctx.job_id)
    # Encoded here, not by httpx's json=, so that a null body is sent as `null`.
    body = json.dumps(delivery.body, ensure_ascii=False, separators=(",", ":")).encode()
    response = await _post(url, addresses, headers, body, host)
    _judge(response, host)


async def _post(
    url: httpx.URL, addresses: list[IPAddress], headers: dict[str, str], body: bytes, host: str
) -> httpx.Response:
    """POST to the first checked address that accepts a connection; returns the response.

    The response body is never read: only the status decides the outcome.
    """
    import httpx

    timeout = httpx.Timeout(TIMEOUT, connect=CONNECT_TIMEOUT)
    # trust_env=False: a proxy from the environment would connect on our behalf,
    # to an address nobody checked.
    async with httpx.AsyncClient(
        timeout=timeout, follow_redirects=False, trust_env=False
    ) as client:
        failure: Exception | None = None
        for ip in addresses:
            request = client.build_request(
                "POST",
                url.copy_with(host=str(ip)),
                content=body,
                headers=headers,
                extensions={"sni_hostname": host},
            )
            try:
                response = await client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                failure = exc  # nothing was sent: the next address may accept
                continue
            except httpx.TransportError as exc:
                raise RuntimeError(f"webhook to {host} failed: {_describe(exc)}") from None
            await response.aclose()
            return response
        raise RuntimeError(f"cannot connect to {host}: {_describe(failure)}")


def _describe(exc: Exception | None) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _judge(response: httpx.Response, host: str) -> None:
    """Success on 2xx; retry on 429 and 5xx; redirects and other 4xx are permanent."""
    status = response.status_code
    answer = f"{host} answered {status} {response.reason_phrase}".rstrip()
    if 200 <= status < 300:
        return
    if 300 <= status < 400:
        raise PermanentError(f"{answer}; redirects are not followed")
    if status == 429 or status >= 500:
        raise RuntimeError(answer)
    if 400 <= status < 500:
        raise PermanentError(answer)
    raise RuntimeError(answer)
