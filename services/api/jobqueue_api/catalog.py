"""The types this API process accepts, and their defaults (`jobcore.catalog`): its own
handlers, JOB_TYPES, and what the workers recorded in `job_types`, read through a cache.

The cache is read again, in the background, once it is older than REFRESH (so changed
options reach the defaults within seconds), and at once, awaited, when a request names a
type it does not hold: a type a worker recorded a moment ago is accepted. Concurrent
misses share one read. A read that fails leaves the cache as it was; for a miss the error
is the request's (a 503, as any other database outage).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore.catalog import MAX_AGE, Known, merged
from jobcore.errors import describe
from jobcore.rows import JobTypeRecord
from jobqueue_api import calls
from jobqueue_api.database import on_driver

log = logging.getLogger("jobqueue.api")

# How old the cache may grow before a request starts a read of it in the background.
REFRESH = 5.0


class TypeCatalog:
    """`known(types)`: what a submit of `types` accepts and applies."""

    def __init__(self, engine: AsyncEngine, named: Iterable[str] = (), refresh: float = REFRESH):
        self._engine = engine
        self._named = tuple(named)
        self._refresh = refresh
        self._records: list[JobTypeRecord] = []
        self._read_at: float | None = None  # loop time of the last read that succeeded
        self._reading: asyncio.Task[None] | None = None
        self._read_started = 0.0  # loop time the latest read began
        self._merged: tuple[int, Known] | None = None

    def current(self) -> Known:
        """The accepted types and defaults as the cache holds them (no read)."""
        # Merged again when the registry or the records changed (a handler registered late
        # in tests; a read): `merged` walks every record.
        from jobcore.registry import known

        stamp = hash((len(known()[0]), id(self._records)))
        if self._merged is None or self._merged[0] != stamp:
            self._merged = (stamp, merged(self._named, self._records))
        return self._merged[1]

    async def known(self, types: Iterable[Any]) -> Known:
        """What a submit naming `types` accepts: a type the cache lacks reads the table first."""
        found = self.current()
        missing = any(isinstance(t, str) and t not in found.types for t in types)
        now = asyncio.get_running_loop().time()
        if missing:
            await self._read()
            found = self.current()
            if self._read_started < now and any(
                isinstance(t, str) and t not in found.types for t in types
            ):
                # The read joined began before this request: its snapshot may predate a
                # worker's record the request relies on. One read of its own decides.
                await self._read()
                found = self.current()
            return found
        if self._read_at is None or now - self._read_at > self._refresh:
            self._start_read()
        return found

    def _start_read(self) -> asyncio.Task[None]:
        if self._reading is None or self._reading.done():
            self._read_started = asyncio.get_running_loop().time()
            self._reading = asyncio.create_task(self._load(), name="job types read")
            self._reading.add_done_callback(_retrieved)
        return self._reading

    async def _read(self) -> None:
        # Shielded: a request that gives up must not cancel the read the others wait on.
        await asyncio.shield(self._start_read())

    async def _load(self) -> None:
        records = await on_driver(
            self._engine, lambda conn, again: calls.recorded_types(conn, MAX_AGE), retry=True
        )
        self._records = records
        self._read_at = asyncio.get_running_loop().time()


def _retrieved(task: asyncio.Task[None]) -> None:
    """A background read's failure is logged here (a miss's read raises it to its request)."""
    exc = None if task.cancelled() else task.exception()
    if exc is not None:
        log.warning("job types not read", extra={"error": describe(exc)})
