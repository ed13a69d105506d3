"""The TCP fault proxy the outage tests rely on does what each mode promises."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from tests.faultproxy import FaultProxy


@pytest.fixture
async def echo() -> AsyncIterator[tuple[str, int]]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[:2]
    server.close()


async def _roundtrip(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes, within: float = 5
) -> bytes:
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(data)), within)


async def test_pass_through_forwards_both_ways(echo: tuple[str, int]):
    with FaultProxy(echo) as proxy:
        reader, writer = await asyncio.open_connection(*proxy.address)
        assert await _roundtrip(reader, writer, b"hello") == b"hello"
        writer.close()


async def test_latency_delays_each_direction(echo: tuple[str, int]):
    with FaultProxy(echo) as proxy:
        reader, writer = await asyncio.open_connection(*proxy.address)
        proxy.add_latency(0.2)
        started = time.monotonic()
        assert await _roundtrip(reader, writer, b"slow") == b"slow"
        assert time.monotonic() - started >= 0.4
        writer.close()


async def test_refuse_closes_the_port_and_pass_through_reopens_it(echo: tuple[str, int]):
    with FaultProxy(echo) as proxy:
        proxy.refuse()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(*proxy.address)
        proxy.pass_through()
        reader, writer = await asyncio.open_connection(*proxy.address)
        assert await _roundtrip(reader, writer, b"back") == b"back"
        writer.close()


async def test_blackhole_keeps_connections_open_but_silent(echo: tuple[str, int]):
    with FaultProxy(echo) as proxy:
        old_reader, old_writer = await asyncio.open_connection(*proxy.address)
        assert await _roundtrip(old_reader, old_writer, b"a") == b"a"
        proxy.blackhole()
        new_reader, new_writer = await asyncio.open_connection(*proxy.address)  # accepted
        for reader, writer in ((old_reader, old_writer), (new_reader, new_writer)):
            with pytest.raises(TimeoutError):
                await _roundtrip(reader, writer, b"lost", within=0.5)
            assert not reader.at_eof()
        assert proxy.open_connections == 2


async def test_cut_resets_open_connections_and_keeps_accepting(echo: tuple[str, int]):
    with FaultProxy(echo) as proxy:
        reader, writer = await asyncio.open_connection(*proxy.address)
        assert await _roundtrip(reader, writer, b"x") == b"x"
        proxy.cut()
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await _roundtrip(reader, writer, b"y")
        reader, writer = await asyncio.open_connection(*proxy.address)
        assert await _roundtrip(reader, writer, b"z") == b"z"
        writer.close()


def test_database_url_points_at_the_proxy():
    proxy = FaultProxy(("127.0.0.1", 5432))
    try:
        url = proxy.database_url("postgresql://u:p@db.example:6543/jobs?sslmode=disable")
        assert url == f"postgresql://u:p@127.0.0.1:{proxy.port}/jobs?sslmode=disable"
        unix = FaultProxy.to_database("postgresql://postgres:@/postgres?host=/tmp/sock")
        assert unix.upstream == "/tmp/sock/.s.PGSQL.5432"
        unix.close()
    finally:
        proxy.close()
