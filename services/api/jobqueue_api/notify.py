"""Wake-ups for workers: a NOTIFY after jobs are created, coalesced under load.

The notification is sent after the job committed, on a connection of its own,
without holding up the response. While one NOTIFY is in flight, further
requests for one collapse into a single follow-up, so a burst of submissions
costs a handful of notifications, not one each. A lost notification only
delays pickup until the workers' next poll.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import store

log = logging.getLogger("jobqueue_api")

NOTIFY_TIMEOUT = 2.0


class Notifier:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._wanted = False
        self._sending: asyncio.Task[None] | None = None

    def jobs_due(self) -> None:
        """Ask for a NOTIFY; returns at once."""
        self._wanted = True
        if self._sending is None:
            self._sending = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        try:
            while self._wanted:
                self._wanted = False
                try:
                    async with asyncio.timeout(NOTIFY_TIMEOUT), self._engine.begin() as conn:
                        await store.notify(conn)
                except Exception as exc:  # workers still poll: a lost wake-up is only latency
                    log.debug("notify failed", extra={"error": f"{type(exc).__name__}: {exc}"})
        finally:
            self._sending = None

    async def close(self) -> None:
        """Let a NOTIFY in flight finish (bounded by its timeout)."""
        if self._sending is not None:
            await asyncio.wait({self._sending})
