"""A TCP fault proxy for tests: put it between a service and PostgreSQL, then break the path.

The proxy listens on a real loopback port and runs its own asyncio loop in a
daemon thread, so sync tests, async tests and services in other processes can
all use it. Every method is thread-safe and returns once the change is in
effect.

    with FaultProxy.to_database(database_url) as proxy:
        url = proxy.database_url(database_url)   # the same database, through the proxy
        proxy.refuse()          # new connections are refused (nothing listens)
        proxy.cut()             # every open connection is closed now (RST)
        proxy.blackhole()       # accept and keep connections, silently drop every byte
        proxy.add_latency(0.5)  # forward, but deliver each chunk 0.5 s late
        proxy.pass_through()    # back to normal

Modes apply to new and already open connections alike, except `cut()`, which
acts once and leaves the mode as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

from sqlalchemy.engine import make_url

T = TypeVar("T")
Upstream = tuple[str, int] | str  # (host, port), or the path of a unix socket


class Mode(Enum):
    PASS_THROUGH = "pass_through"
    LATENCY = "latency"
    REFUSE = "refuse"
    BLACKHOLE = "blackhole"


@dataclass(eq=False)
class _Connection:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                _reset(writer)
        for task in self.tasks:
            task.cancel()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN, like a dropped network path or a dead server."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """Forwards 127.0.0.1:<port> to `upstream`, with faults switched on demand."""

    def __init__(self, upstream: Upstream, port: int = 0) -> None:
        self.upstream = upstream
        self.host = "127.0.0.1"
        self.port = port
        self.mode = Mode.PASS_THROUGH
        self.latency = 0.0
        self.accepted = 0  # connections accepted since start, in any mode
        self._connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._call(self._listen)

    @classmethod
    def to_database(cls, url: str) -> FaultProxy:
        """A proxy to the server of a libpq-style database URL (TCP or unix socket)."""
        parsed = make_url(url)
        host = parsed.query.get("host")
        if isinstance(host, str) and host.startswith("/"):
            return cls(f"{host}/.s.PGSQL.{parsed.port or 5432}")
        return cls((parsed.host or "127.0.0.1", parsed.port or 5432))

    def database_url(self, url: str) -> str:
        """`url` with its server replaced by this proxy."""
        parsed = make_url(url)
        query = {k: v for k, v in parsed.query.items() if k != "host"}
        parsed = parsed.set(host=self.host, port=self.port, query=query)
        return parsed.render_as_string(hide_password=False)

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def open_connections(self) -> int:
        return self._call(self._count)

    # --- switching faults ---------------------------------------------------

    def pass_through(self) -> None:
        self._call(self._set, Mode.PASS_THROUGH, 0.0)

    def add_latency(self, seconds: float) -> None:
        self._call(self._set, Mode.LATENCY, seconds)

    def refuse(self) -> None:
        self._call(self._set, Mode.REFUSE, 0.0)

    def blackhole(self) -> None:
        self._call(self._set, Mode.BLACKHOLE, 0.0)

    def cut(self) -> None:
        self._call(self._cut)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(self._close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- inside the proxy's loop ------------------------------------------------

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return asyncio.run_coroutine_threadsafe(fn(*args), self._loop).result(10)

    async def _count(self) -> int:
        return len(self._connections)

    async def _listen(self) -> None:
        # A fixed port once chosen, so a refused-then-restored proxy keeps its address.
        for attempt in range(50):
            try:
                self._server = await asyncio.start_server(
                    self._accept, self.host, self.port, reuse_address=True
                )
                break
            except OSError:
                if attempt == 49:
                    raise
                await asyncio.sleep(0.1)
        assert self._server is not None
        self.port = self._server.sockets[0].getsockname()[1]

    async def _set(self, mode: Mode, latency: float) -> None:
        self.mode, self.latency = mode, latency
        if mode is Mode.REFUSE and self._server is not None:
            self._server.close()
            self._server = None
        elif mode is not Mode.REFUSE and self._server is None:
            await self._listen()

    async def _cut(self) -> None:
        for conn in list(self._connections):
            conn.abort()
        self._connections.clear()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._cut()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        conn = _Connection(writer)
        self._connections.add(conn)
        try:
            if self.mode is Mode.BLACKHOLE:
                # Half-open: the peer believes it is connected; nothing ever comes back.
                while await reader.read(65536):
                    pass
                return
            try:
                if isinstance(self.upstream, str):
                    up_reader, up_writer = await asyncio.open_unix_connection(self.upstream)
                else:
                    up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError:
                conn.abort()
                return
            conn.upstream = up_writer
            conn.tasks = [
                asyncio.create_task(self._pipe(reader, up_writer)),
                asyncio.create_task(self._pipe(up_reader, writer)),
            ]
            await asyncio.gather(*conn.tasks)
            for end in (writer, up_writer):
                end.close()
        except (OSError, asyncio.CancelledError):
            conn.abort()
        finally:
            self._connections.discard(conn)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction; chunks keep their order and each is held `latency` seconds.

        An end of stream is passed on as a half-close, so a clean disconnect stays clean.
        """
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if data is None:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                if self.mode is Mode.BLACKHOLE:
                    continue
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(deliver())
        try:
            while data := await reader.read(65536):
                if sender.done():
                    sender.result()  # the write side failed: raise its error
                if self.mode is not Mode.BLACKHOLE:
                    queue.put_nowait((time.monotonic() + self.latency, data))
            queue.put_nowait((time.monotonic() + self.latency, None))
            await sender
        finally:
            sender.cancel()
