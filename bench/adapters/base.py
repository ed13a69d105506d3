"""What the harness asks of every queue, and the plumbing the adapters share."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import asyncpg


class Adapter(Protocol):
    """One queue system on a database of its own. Every submit returns once committed."""

    name: str

    def describe(self) -> dict[str, Any]:
        """Version and the settings in force, for the report."""
        ...

    async def prepare(self) -> None:
        """Create the database, apply the system's schema, open client connections."""
        ...

    async def cleanup(self) -> None:
        """Stop everything started, close connections, drop the database."""
        ...

    async def start_workers(self, processes: int) -> None: ...

    async def stop_workers(self) -> None: ...

    async def enqueue_many(self, n: int) -> None:
        """Bulk-enqueue n no-op jobs, committed together."""
        ...

    async def submit(self, payload: dict[str, Any]) -> None:
        """Submit one job the way a client of this system would."""
        ...

    async def remaining(self) -> int:
        """Jobs not finished yet (queued or running)."""
        ...

    async def last_completion(self) -> float:
        """Epoch time of the latest recorded completion (the database's clock)."""
        ...


async def to_the_end(clean_up: Awaitable[None]) -> None:
    """Await a clean-up that a cancellation (Ctrl-C, SIGTERM) must not cut short.

    The clean-up runs as a task of its own; if the caller is cancelled meanwhile,
    it still waits for the clean-up to finish, then lets the cancellation go on.
    """
    task = asyncio.ensure_future(clean_up)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


class Unsupported(Exception):
    """The system lacks the operation a measurement needs."""


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


async def wait_until(
    check: Callable[[], Awaitable[bool]],
    limit: float,
    what: str,
    procs: list[subprocess.Popen[bytes]] | None = None,
    log: Path | None = None,
    interval: float = 0.1,
) -> None:
    """Poll `check` until true; fail early, with the log's tail, if a process exited."""
    deadline = time.monotonic() + limit
    while not await check():
        for proc in procs or []:
            if proc.poll() is not None:
                tail = log_tail(log) if log else ""
                raise RuntimeError(f"{what}: process exited with {proc.returncode}\n{tail}")
        if time.monotonic() > deadline:
            tail = log_tail(log) if log else ""
            raise TimeoutError(f"timed out after {limit:.0f}s waiting for {what}\n{tail}")
        await asyncio.sleep(interval)


class Sql:
    """The harness's own connection to a system's database, for counts and timestamps."""

    def __init__(self) -> None:
        self.conn: asyncpg.Connection | None = None

    async def open(self, url: str) -> None:
        self.conn = await asyncpg.connect(url)

    async def value(self, query: str, *args: Any) -> Any:
        assert self.conn is not None
        return await self.conn.fetchval(query, *args)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
            self.conn = None
