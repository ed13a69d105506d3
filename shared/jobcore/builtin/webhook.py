"""The `webhook` handler: POSTs a JSON body to a URL, refusing private destinations.

The host is resolved once and judged by `webhook_policy` on the addresses it
denotes; the request then goes, through the process's shared connection pool
(`webhook_pool`), only to the addresses that were checked, with the original
`Host` header and TLS server name, so DNS cannot answer differently between the
check and the connection. The pool and its TLS context are built once per
process, in a thread; the API imports this module too, so nothing third-party
is imported here until a webhook is sent.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
import socket
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from jobcore.builtin.webhook_policy import (
    IPAddress,
    embedded_ipv4,
    is_forbidden,
    is_local_name,
    parse_ip_literal,
)
from jobcore.errors import PermanentError
from jobcore.registry import JobContext, handler

if TYPE_CHECKING:
    import httpcore

__all__ = [
    "Delivery",
    "close_pools",
    "embedded_ipv4",
    "is_forbidden",
    "is_local_name",
    "parse_ip_literal",
    "parse_payload",
    "resolve",
    "shared_pool",
    "webhook",
]

log = logging.getLogger("jobqueue.webhook")

CONNECT_TIMEOUT = 10.0
TIMEOUT = 30.0

# Headers that frame the request or that the handler owns.
_RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "idempotency-key"}
)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e]*")


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


# The pools of the event loop they were made on, one per address policy: a connection
# made to an address one policy allows is never reused under the other.
_loop: asyncio.AbstractEventLoop | None = None
_pools: dict[bool, httpcore.AsyncConnectionPool] = {}
_module: ModuleType | None = None


def _load() -> ModuleType:
    """Import the HTTP stack and build the TLS context: run in a thread, once."""
    import httpx  # noqa: F401  # for `_parse_url`, which then finds it imported

    from jobcore.builtin import webhook_pool

    webhook_pool.tls_context()
    return webhook_pool


async def shared_pool(allow_private: bool) -> httpcore.AsyncConnectionPool:
    """This event loop's connection pool for the policy, built on first use off the loop."""
    global _loop, _module
    loop = asyncio.get_running_loop()
    if _loop is loop:
        pool = _pools.get(allow_private)
        if pool is not None:
            return pool
    if _module is None:
        _module = await loop.run_in_executor(None, _load)
    if _loop is not loop:
        # Connections of another (finished) event loop cannot be used on this one.
        _loop = loop
        _pools.clear()
    pool = _pools.get(allow_private)
    if pool is None:
        pool = _pools[allow_private] = _module.new_pool()
    return pool


async def close_pools() -> None:
    """Close this event loop's pools and their connections (they are rebuilt on next use)."""
    global _loop
    if _loop is asyncio.get_running_loop():
        pools = list(_pools.values())
        _pools.clear()
        _loop = None
        for pool in pools:
            await pool.aclose()


@dataclass(frozen=True, slots=True)
class _Target:
    scheme: str
    given: str  # the host as the URL spells it: what errors name
    host: str  # the name for Host, TLS and the pool, or the canonical IP of a numeric host
    netloc: bytes
    port: int
    path: bytes
    literal: IPAddress | None


def _parse_url(text: str) -> _Target:
    import httpx  # imported already by `_load`

    try:
        url = httpx.URL(text)
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
    return _Target(
        url.scheme,
        host,
        host if literal is None else str(literal),
        url.netloc,
        port,
        url.raw_path,
        literal,
    )


@handler("webhook")
async def webhook(payload: Any, ctx: JobContext) -> None:
    delivery = parse_payload(payload)
    pool = await shared_pool(ctx.webhook_allow_private)
    target = _parse_url(delivery.url)
    host = target.given
    if not ctx.webhook_allow_private and target.literal is None and is_local_name(host):
        raise PermanentError(f"refusing to send to {host}: it names this machine")
    if target.literal is not None:
        addresses: list[IPAddress] = [target.literal]
    else:
        try:
            addresses = await resolve(target.host, target.port)
        except OSError as exc:
            raise RuntimeError(f"cannot resolve {host}: {exc}") from None
        if not addresses:
            raise RuntimeError(f"cannot resolve {host}: no addresses")
    if not ctx.webhook_allow_private:
        forbidden = [str(ip) for ip in addresses if is_forbidden(ip)]
        if forbidden:
            # The addresses a name resolves to are for the operator, not for API clients
            # (last_error): they would map the internal network.
            log.warning(
                "webhook destination refused: not a public address",
                extra={"host": host, "addresses": forbidden},
            )
            raise PermanentError(
                f"refusing to send to {host}: destination is not a public address; "
                "set WEBHOOK_ALLOW_PRIVATE=true to allow"
            )

    headers = [(b"Host", target.netloc)]
    headers += [(k.encode("ascii"), v.encode("ascii")) for k, v in delivery.headers.items()]
    if not any(name.lower() == "content-type" for name in delivery.headers):
        headers.append((b"Content-Type", b"application/json"))
    headers.append((b"Idempotency-Key", str(ctx.job_id).encode("ascii")))
    # `null` for a missing body: the receiver always gets JSON.
    body = json.dumps(delivery.body, ensure_ascii=False, separators=(",", ":")).encode()
    headers.append((b"Content-Length", str(len(body)).encode("ascii")))

    module = _module
    assert module is not None  # loaded by shared_pool
    to = module.Destination(target.host, target.port, tuple(str(ip) for ip in addresses))
    timeouts = {"connect": CONNECT_TIMEOUT, "read": TIMEOUT, "write": TIMEOUT, "pool": TIMEOUT}
    try:
        status, reason = await module.post(
            pool, to, target.scheme, target.path, headers, body, timeouts
        )
    except module.DeliveryFailed as exc:
        raise RuntimeError(str(exc)) from None
    _judge(status, reason, host)


def _judge(status: int, reason: str, host: str) -> None:
    """Success on 2xx; retry on 429 and 5xx; redirects and other 4xx are permanent."""
    answer = f"{host} answered {status} {reason}".rstrip()
    if 200 <= status < 300:
        return
    if 300 <= status < 400:
        raise PermanentError(f"{answer}; redirects are not followed")
    if status == 429 or status >= 500:
        raise RuntimeError(answer)
    if 400 <= status < 500:
        raise PermanentError(answer)
    raise RuntimeError(answer)
