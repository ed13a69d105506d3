"""Wake-ups for workers: a NOTIFY when jobs are created, debounced under load.

A single submission normally carries its NOTIFY in its own statement
(`store.submit(..., notify=True)`), delivered at commit, so an idle worker can
start the job before the client has its answer. At most one submission per
`INLINE_EVERY` does so; the others ask `jobs_due()` for a NOTIFY after their
commit, on a connection of its own: while one is in flight, further requests
collapse into a single follow-up, so a burst costs a handful of notifications,
not one each. A lost notification only delays pickup until the next poll. Submits grouped
into one statement (`groups`) share one NOTIFY.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore.errors import describe
from jobqueue_api import calls
from jobqueue_api.database import on_driver

log = logging.getLogger("jobqueue.api")

NOTIFY_TIMEOUT = 2.0
INLINE_EVERY = 0.005


class Notifier:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._wanted = False
        self._sending: asyncio.Task[None] | None = None
        self._last_inline = float("-inf")

    def inline(self) -> bool:
        """Whether the next submission should carry its own NOTIFY (see the module docstring)."""
        now = asyncio.get_running_loop().time()
        if now - self._last_inline < INLINE_EVERY:
            return False
        self._last_inline = now
        return True

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
                    async with asyncio.timeout(NOTIFY_TIMEOUT):
                        await on_driver(
                            self._engine, lambda conn, again: calls.notify(conn), retry=False
                        )
                except Exception as exc:  # workers still poll: a lost wake-up is only latency
                    log.debug("notify failed", extra={"error": describe(exc)})
        finally:
            self._sending = None

    async def close(self) -> None:
        """Let a NOTIFY in flight finish (bounded by its timeout)."""
        if self._sending is not None:
            await asyncio.wait({self._sending})
