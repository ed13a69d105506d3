"""LISTEN/NOTIFY wake-ups: one listening connection per worker process.

Submissions notify `jobcore.store.NOTIFY_CHANNEL`; each notification wakes the
dispatcher at once instead of after POLL_INTERVAL. A notification is only a
hint (polling stays the fallback), but a listener that silently stopped
hearing would turn every pickup into a poll: so the connection is checked
with a `SELECT 1` under a short timeout every few seconds, which also catches
a half-open connection (no RST, no answer), and is re-established with
backoff. After every (re)connect the dispatcher is woken, since notifications
sent while nobody listened are lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import asyncpg

from jobcore.backoff import Retry
from jobcore.db import connect_args
from jobcore.errors import describe
from jobcore.store import NOTIFY_CHANNEL
from jobqueue_worker.loops import Loop

log = logging.getLogger("jobqueue.worker")

CHECK_INTERVAL = 5.0
CHECK_TIMEOUT = 2.0
CONNECT_TIMEOUT = 5.0


class Listener(Loop):
    """Holds the LISTEN connection, calling `wake()` on each notification. Each round
    connects if there is no connection, else checks the one there is."""

    name = "listener"

    def __init__(
        self, database_url: str, wake: Callable[[], None], check_interval: float = CHECK_INTERVAL
    ) -> None:
        super().__init__(check_interval, Retry(0.25, 5.0))
        self._database_url = database_url
        self._wake = wake
        self._conn: asyncpg.Connection | None = None

    async def run_once(self) -> None:
        try:
            if self._conn is None:
                await self._connect()
            else:
                async with asyncio.timeout(CHECK_TIMEOUT):
                    await self._conn.fetchval("SELECT 1")
        except BaseException:
            self.close()
            raise

    async def _connect(self) -> None:
        self._conn = await asyncpg.connect(
            **connect_args(
                self._database_url,
                application_name="jobqueue-worker-listen",
                timeout=CONNECT_TIMEOUT,
            )
        )
        await self._conn.add_listener(NOTIFY_CHANNEL, lambda *_: self._wake())
        log.info("listening for wake-ups", extra={"channel": NOTIFY_CHANNEL})
        # Notifications sent while nobody listened are lost: look for due jobs now.
        self._wake()

    def close(self) -> None:
        if self._conn is not None:
            # terminate(), not close(): close() would wait on a half-open socket.
            self._conn.terminate()
            self._conn = None

    def failed(self, exc: Exception) -> None:
        log.warning("wake-up listener lost", extra={"error": describe(exc)})

    def recovered(self) -> None:
        pass  # "listening for wake-ups" says it

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await super().run(stop)
        finally:
            self.close()
