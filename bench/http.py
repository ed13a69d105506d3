"""A minimal HTTP/1.1 keep-alive client for loading the API.

A general client (httpx) spends more CPU per request than the server under
test; on a 2-core machine that would measure the client. This one writes the
request in one call and reads the response by Content-Length (or chunks).
"""

from __future__ import annotations

import asyncio
import contextlib


class HttpError(Exception):
    pass


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def request(
        self, method: str, path: str, body: bytes = b"", host: str = "127.0.0.1"
    ) -> tuple[int, bytes]:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise HttpError("connection closed by the server")
        status = int(status_line.split()[1])
        length = 0
        chunked = False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if not chunked:
            return status, await self.reader.readexactly(length)
        parts = []
        while True:
            size = int((await self.reader.readline()).split(b";")[0], 16)
            data = await self.reader.readexactly(size + 2)
            if size == 0:
                return status, b"".join(parts)
            parts.append(data[:-2])

    def close(self) -> None:
        self.writer.close()


class Pool:
    """Keep-alive connections to one server, opened on demand and reused."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._idle: list[Connection] = []
        self._all: list[Connection] = []

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        reused = bool(self._idle)
        conn = self._idle.pop() if reused else await self._open()
        try:
            result = await conn.request(method, path, body, self.host)
        except (HttpError, ConnectionError, asyncio.IncompleteReadError):
            self._discard(conn)
            if not reused:
                raise
            # The server closed a connection that sat idle past its keep-alive
            # timeout before reading this request: send it once more on a new one.
            conn = await self._open()
            try:
                result = await conn.request(method, path, body, self.host)
            except BaseException:
                self._discard(conn)
                raise
        except BaseException:
            self._discard(conn)
            raise
        self._idle.append(conn)
        return result

    def _discard(self, conn: Connection) -> None:
        conn.close()
        self._all.remove(conn)

    async def _open(self) -> Connection:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        conn = Connection(reader, writer)
        self._all.append(conn)
        return conn

    async def close(self) -> None:
        for conn in self._all:
            conn.close()
            with contextlib.suppress(Exception):
                await conn.writer.wait_closed()
        self._all.clear()
        self._idle.clear()


async def get_status(host: str, port: int, path: str) -> int | None:
    """The status of one GET, or None when nothing answers."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
    except (OSError, TimeoutError):
        return None
    conn = Connection(reader, writer)
    try:
        status, _ = await asyncio.wait_for(conn.request("GET", path, host=host), 5)
        return status
    except (OSError, TimeoutError, HttpError, asyncio.IncompleteReadError, ValueError):
        return None
    finally:
        conn.close()
