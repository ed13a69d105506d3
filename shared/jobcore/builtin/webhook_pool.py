"""The HTTP connection pool that webhook deliveries of one process share.

Imported by the worker only, in a thread, the first time a webhook is sent (see
`jobcore.builtin.webhook.shared_pool`): importing httpcore and building the TLS
context (loading the CA bundle) cost tens of milliseconds of CPU, which must
not stall the event loop. A pool is then cheap to make and is reused by every
delivery on its event loop, so a delivery costs a request, not a client.

The pool never resolves a name. Requests keep the host name the user gave, so
the `Host` header, the TLS server name and the certificate check are all for
that name, and connections are pooled per (scheme, host name, port); the
network backend then connects only to the addresses the handler resolved and
checked for that name, which it is handed in `destination` for the request.
A pooled connection is reused only for the same name, port and address policy.
"""

from __future__ import annotations

import asyncio
import select
import socket
import ssl
import sys
import threading
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import certifi
import httpcore

from jobcore.errors import JobqueueError, describe

try:
    import sniffio  # noqa: F401
except ImportError:
    # httpcore imports sniffio whenever it makes a lock or event (several per request) and
    # falls back to asyncio without it; a failing import searches all of sys.path each time.
    # Recorded as missing once, the import fails at once.
    sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]

# Bounds keep-alive state; concurrency is already bounded by the worker's job slots.
MAX_KEEPALIVE = 64
# Under the 5 s idle timeout of common servers (Node.js), so they rarely close a connection
# just as a request is sent on it.
KEEPALIVE_EXPIRY = 4.0


@dataclass(frozen=True, slots=True)
class Destination:
    """The only addresses a connection for `host`:`port` may go to: those the handler
    checked."""

    host: str
    port: int
    addresses: tuple[str, ...]


destination: ContextVar[Destination | None] = ContextVar("webhook_destination", default=None)


class CheckedBackend(httpcore.AsyncNetworkBackend):
    """Connects to the checked addresses of the request's host, in order, never elsewhere."""

    def __init__(self) -> None:
        self.network = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109  # httpcore calls it so
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        target = destination.get()
        if target is None or target.host != host or target.port != port:
            raise httpcore.ConnectError(f"no checked address for {host}:{port}")
        failure: Exception = httpcore.ConnectError(f"no address for {host}")
        for address in target.addresses:
            try:
                stream = await self.network.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc  # nothing was sent: the next address may accept
            else:
                return _Stream(stream)
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109  # httpcore calls it so
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("webhooks are sent over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self.network.sleep(seconds)


class _Stream(httpcore.AsyncNetworkStream):
    """httpcore's anyio stream, answering `is_readable` straight from the socket.

    The pool asks every pooled connection whether it is readable (closed by the
    server) each time a request starts or ends; anyio answers through a mapping
    it builds anew per question, which cost more than the rest of a request.
    """

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self.stream = stream
        self.socket: socket.socket | None = stream.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        return await self.stream.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await self.stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> httpcore.AsyncNetworkStream:
        return _Stream(await self.stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            fd = -1 if self.socket is None else self.socket.fileno()
            if fd < 0:
                return True  # gone: as if the next read returned the end
            poll = select.poll()
            poll.register(fd, select.POLLIN)
            return bool(poll.poll(0))
        return self.stream.get_extra_info(info)


_tls: ssl.SSLContext | None = None
_tls_lock = threading.Lock()


def tls_context() -> ssl.SSLContext:
    """The process's TLS client context (certifi's CA bundle), built on first use.

    CPU-heavy: call it off the event loop the first time.
    """
    global _tls
    with _tls_lock:
        if _tls is None:
            _tls = ssl.create_default_context(cafile=certifi.where())
        return _tls


def new_pool() -> httpcore.AsyncConnectionPool:
    """A connection pool for one event loop (cheap once `tls_context()` was built)."""
    return httpcore.AsyncConnectionPool(
        ssl_context=tls_context(),
        max_connections=None,
        max_keepalive_connections=MAX_KEEPALIVE,
        keepalive_expiry=KEEPALIVE_EXPIRY,
        http1=True,
        http2=False,
        retries=0,
        network_backend=CheckedBackend(),
    )


# A response body is read (and dropped) only so that its connection can be reused: up to
# this much, for this long; past either, the connection is closed instead.
_DRAIN_BYTES = 64 * 1024
_DRAIN_SECONDS = 1.0


class DeliveryFailed(JobqueueError):
    """Nothing or not all was delivered: the connection failed or timed out."""


async def post(
    pool: httpcore.AsyncConnectionPool,
    to: Destination,
    scheme: str,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    timeouts: dict[str, float],
) -> tuple[int, str]:
    """POST `body` to `to` (only to its checked addresses); the status and reason phrase.

    Only the status decides the outcome: the response body is never looked at.
    """
    token = destination.set(to)
    try:
        request = httpcore.Request(
            b"POST",
            httpcore.URL(scheme=scheme, host=to.host, port=to.port, target=target),
            headers=headers,
            content=body,
            extensions={"timeout": timeouts},
        )
        try:
            response = await pool.handle_async_request(request)
        except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
            raise DeliveryFailed(f"cannot connect to {to.host}: {describe(exc)}") from None
        except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError) as exc:
            raise DeliveryFailed(f"webhook to {to.host} failed: {describe(exc)}") from None
        try:
            await _drain(response)
        finally:
            await response.aclose()
        reason = response.extensions.get("reason_phrase", b"")
        return response.status, reason.decode("ascii", "replace")
    finally:
        destination.reset(token)


async def _drain(response: httpcore.Response) -> None:
    try:
        async with asyncio.timeout(_DRAIN_SECONDS):
            size = 0
            async for chunk in response.aiter_stream():
                size += len(chunk)
                if size > _DRAIN_BYTES:
                    return
    except (TimeoutError, httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError):
        pass  # the status is already known; the connection is just not reused
