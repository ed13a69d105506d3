"""Handler start signals: a handler sends one UDP datagram to the benchmark process.

The datagram carries the job's marker, the handler's `time.time()` at start and
its pid, so pickup latency is measured on the one clock of this machine without
asking the database, and the benchmark learns which worker processes are live.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

_sock: socket.socket | None = None


def report(marker: str, port: int) -> None:
    """Called first thing by a benchmark handler whose payload carries a marker."""
    global _sock
    now = time.time()
    if _sock is None:
        _sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _sock.sendto(f"{marker} {now!r} {os.getpid()}".encode(), ("127.0.0.1", port))


def report_payload(payload: Any) -> None:
    """`report()` for a payload shaped like {"m": marker, "p": port}; others are silent."""
    if isinstance(payload, dict) and payload.get("m"):
        report(str(payload["m"]), int(payload["p"]))


class Receiver(asyncio.DatagramProtocol):
    """The benchmark side: futures resolved by marker with (handler start time, pid)."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[tuple[float, int]]] = {}
        self.transport: asyncio.DatagramTransport | None = None
        self.port = 0

    @classmethod
    async def open(cls) -> Receiver:
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_datagram_endpoint(cls, local_addr=("127.0.0.1", 0))
        protocol.transport = transport
        protocol.port = transport.get_extra_info("sockname")[1]
        return protocol

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def expect(self, marker: str) -> asyncio.Future[tuple[float, int]]:
        future: asyncio.Future[tuple[float, int]] = asyncio.get_running_loop().create_future()
        self._waiting[marker] = future
        return future

    def datagram_received(self, data: bytes, addr: Any) -> None:
        marker, started, pid = data.decode().split()
        future = self._waiting.pop(marker, None)
        if future is not None and not future.done():
            future.set_result((float(started), int(pid)))

    def payload(self, marker: str) -> dict[str, Any]:
        return {"m": marker, "p": self.port}
