"""The worker's view of the database: the `JobStore` protocol and its PostgreSQL implementation.

The dispatcher, completer and recovery loop depend only on `JobStore`, so unit
tests can hand them an in-memory store. `PgJobStore` runs each `jobcore.store`
operation (a single statement) in a transaction of its own, which costs no
extra round trip on an autocommit engine, under a client-side timeout that also
covers a connection gone silent; it logs the database's availability once per
change of state, not once per call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import store
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


class JobStore(Protocol):
    """The store operations a worker process performs; outcome writes return the lost leases."""

    async def claim(self, n: int, lease_seconds: float) -> list[Claimed]: ...

    async def complete(self, leases: Sequence[Lease]) -> list[Lease]: ...

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
    """`JobStore` over `jobcore.store`: one transaction per call, each under a timeout."""

    def __init__(self, engine: AsyncEngine, availability: Availability | None = None) -> None:
        self.engine = engine
        self.availability = availability or Availability()

    async def _run(
        self,
        operation: str,
        limit: float,
        statement: Callable[..., Awaitable[T]],
        *args: Any,
    ) -> T:
        started = self.availability.now()
        try:
            async with asyncio.timeout(limit), self.engine.begin() as conn:
                result = await statement(conn, *args)
        except Exception as exc:
            self.availability.failed(operation, exc, started)
            raise
        self.availability.succeeded(started)
        return result

    async def claim(self, n: int, lease_seconds: float) -> list[Claimed]:
        return await self._run("claim", CLAIM_TIMEOUT, store.claim, n, lease_seconds)

    async def complete(self, leases: Sequence[Lease]) -> list[Lease]:
        return await self._run("complete", WRITE_TIMEOUT, store.complete, leases)

    async def fail(self, leases: Sequence[Lease], errors: Sequence[str]) -> list[Lease]:
        return await self._run("fail", WRITE_TIMEOUT, store.fail, leases, errors)

    async def dead_letter(self, leases: Sequence[Lease], errors: Sequence[str]) -> list[Lease]:
        return await self._run("dead_letter", WRITE_TIMEOUT, store.dead_letter, leases, errors)

    async def retry_later(
        self, leases: Sequence[Lease], errors: Sequence[str], delays: Sequence[float]
    ) -> list[Lease]:
        return await self._run(
            "retry_later", WRITE_TIMEOUT, store.retry_later, leases, errors, delays
        )

    async def release(self, leases: Sequence[Lease]) -> list[Lease]:
        return await self._run("release", WRITE_TIMEOUT, store.release, leases)

    async def recover_expired(self) -> list[tuple[UUID, Status]]:
        return await self._run("recover_expired", RECOVER_TIMEOUT, store.recover_expired)
