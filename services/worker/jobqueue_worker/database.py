"""The worker's view of the database: the `JobStore` protocol and its PostgreSQL implementation.

The dispatcher, completer and recovery loop depend only on `JobStore`, so unit
tests can hand them an in-memory store. `PgJobStore` runs each store operation
(a single statement, which commits on its own) under a client-side timeout that
also covers a connection gone silent, and logs the database's availability once
per change of state, not once per call.

The statements are `jobcore.store`'s, run through `jobcore.compiled` on the
asyncpg connection, the hot path's cost being the driver's alone. For the same
reason a connection stays checked out of the engine's pool between calls; one
that failed in any way is closed and replaced, so a broken one is never reused.
Statements are planned at every run, for the table as it is (see _PLANNING).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from jobcore import compiled
from jobcore.states import Status
from jobcore.store import Claimed, Lease

log = logging.getLogger("jobqueue.worker")

T = TypeVar("T")

# A claim reads a few index entries; if it takes this long the database is in trouble.
CLAIM_TIMEOUT = 10.0
# "Outcome writes use their own short timeout": a slot waits on its write, so keep it short.
WRITE_TIMEOUT = 5.0
# recover_expired may touch many rows after a long outage.
RECOVER_TIMEOUT = 30.0
# Connections per child: one each for the dispatcher, the completer and recovery, plus one spare.
POOL_SIZE = 4
# How the worker's connections plan. A queue's table swings from nearly empty to tens of
# thousands of pending jobs between two ANALYZEs, and plans made for the small table
# read all of the big one per claim (ms to 100s of ms per claim, and the other
# processes' writes queue behind its row locks): a sequential scan to find 50 rows by
# id, or every pending job fetched and sorted instead of the first 50 read from the claim
# index in order. So each run is planned for the table as it is (asyncpg prepares each
# statement once, and after five runs PostgreSQL would otherwise keep one generic plan),
# for ~0.2-0.5 ms per statement, and never with a sort: every statement here is meant to
# walk an index in its order.
_PLANNING = "SET plan_cache_mode = force_custom_plan; SET enable_sort = off"


class JobStore(Protocol):
    """The store operations a worker process performs; outcome writes return the lost leases."""

    async def claim(self, n: int, lease_seconds: float) -> list[Claimed]: ...

    async def complete(self, leases: Sequence[Lease]) -> list[Lease]: ...

    async def complete_and_claim(
        self, leases: Sequence[Lease], n: int, lease_seconds: float
    ) -> tuple[list[Lease], list[Claimed]]: ...

    async def fail(self, leases: Sequence[Lease], errors: Sequence[str]) -> list[Lease]: ...

    async def dead_letter(self, leases: Sequence[Lease], errors: Sequence[str]) -> list[Lease]: ...

    async def retry_later(
        self, leases: Sequence[Lease], errors: Sequence[str], delays: Sequence[float]
    ) -> list[Lease]: ...

    async def release(self, leases: Sequence[Lease]) -> list[Lease]: ...

    async def recover_expired(self) -> list[tuple[UUID, Status]]: ...


class Availability:
    """Remembers whether the database answered lately; logs only when that changes.

    A call that started before the latest success says nothing new when it fails
    (it may have hung on a connection that broke earlier), so it does not count.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.up = True
        self._clock = clock
        self._last_success = float("-inf")

    def now(self) -> float:
        return self._clock()

    def succeeded(self, started: float) -> None:
        self._last_success = max(self._last_success, started)
        if not self.up:
            self.up = True
            log.info("database available again")

    def failed(self, operation: str, exc: BaseException, started: float) -> None:
        if self.up and started >= self._last_success:
            self.up = False
            log.warning(
                "database unavailable", extra={"operation": operation, "error": describe(exc)}
            )


def describe(exc: BaseException) -> str:
    text = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


class PgJobStore:
    """`JobStore` over `jobcore.compiled`: one statement per call, each under a timeout."""

    def __init__(self, engine: AsyncEngine, availability: Availability | None = None) -> None:
        self.engine = engine
        self.availability = availability or Availability()
        # Connections checked out of the engine and kept between calls, with their asyncpg
        # connection: at most one per concurrent caller (dispatcher, completer, recovery).
        self._idle: list[tuple[AsyncConnection, compiled.Driver]] = []

    async def _run(
        self,
        operation: str,
        limit: float,
        statement: Callable[..., Awaitable[T]],
        *args: Any,
    ) -> T:
        started = self.availability.now()
        held = None
        try:
            async with asyncio.timeout(limit):
                held = self._idle.pop() if self._idle else await self._checkout()
                result = await statement(held[1], *args)
        except BaseException as exc:
            if held is not None:
                await _discard(held)
            if isinstance(exc, Exception):
                self.availability.failed(operation, exc, started)
            raise
        self._idle.append(held)
        self.availability.succeeded(started)
        return result

    async def _checkout(self) -> tuple[AsyncConnection, compiled.Driver]:
        conn = await self.engine.connect()
        try:
            raw = await conn.get_raw_connection()
        except BaseException:
            await conn.close()
            raise
        driver = raw.driver_connection
        assert driver is not None  # a checked-out connection has one
        try:
            await driver.execute(_PLANNING)
        except BaseException:
            await _discard((conn, driver))
            raise
        return conn, driver

    async def close(self) -> None:
        """Give the kept connections back to the engine (before it is disposed)."""
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            await conn.close()

    async def claim(self, n: int, lease_seconds: float) -> list[Claimed]:
        return await self._run("claim", CLAIM_TIMEOUT, compiled.claim, n, lease_seconds)

    async def complete(self, leases: Sequence[Lease]) -> list[Lease]:
        return await self._run("complete", WRITE_TIMEOUT, compiled.complete, leases)

    async def complete_and_claim(
        self, leases: Sequence[Lease], n: int, lease_seconds: float
    ) -> tuple[list[Lease], list[Claimed]]:
        return await self._run(
            "complete", WRITE_TIMEOUT, compiled.complete_and_claim, leases, n, lease_seconds
        )

    async def fail(self, leases: Sequence[Lease], errors: Sequence[str]) -> list[Lease]:
        return await self._run("fail", WRITE_TIMEOUT, compiled.fail, leases, errors)

    async def dead_letter(self, leases: Sequence[Lease], errors: Sequence[str]) -> list[Lease]:
        return await self._run("dead_letter", WRITE_TIMEOUT, compiled.dead_letter, leases, errors)

    async def retry_later(
        self, leases: Sequence[Lease], errors: Sequence[str], delays: Sequence[float]
    ) -> list[Lease]:
        return await self._run(
            "retry_later", WRITE_TIMEOUT, compiled.retry_later, leases, errors, delays
        )

    async def release(self, leases: Sequence[Lease]) -> list[Lease]:
        return await self._run("release", WRITE_TIMEOUT, compiled.release, leases)

    async def recover_expired(self) -> list[tuple[UUID, Status]]:
        return await self._run("recover_expired", RECOVER_TIMEOUT, compiled.recover_expired)


async def _discard(held: tuple[AsyncConnection, Any]) -> None:
    """Drop a connection a call failed on: whatever state it is in, it is not reused."""
    conn, driver = held
    # terminate() first: closing a silent connection gracefully would wait on it.
    driver.terminate()
    try:
        await conn.invalidate()
        await conn.close()
    except Exception:
        log.debug("closing a failed connection failed", exc_info=True)
