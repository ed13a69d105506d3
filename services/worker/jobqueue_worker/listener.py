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
import contextlib
import logging
from collections.abc import Callable

import asyncpg

from jobcore.db import connect_args
from jobcore.store import NOTIFY_CHANNEL

log = logging.getLogger("jobqueue.worker")

CHECK_INTERVAL = 5.0
CHECK_TIMEOUT = 2.0
CONNECT_TIMEOUT = 5.0
_RETRY_FIRST = 0.25
_RETRY_MAX = 5.0


async def listen(
    database_url: str,
    wake: Callable[[], None],
    stopped: asyncio.Event,
    *,
    check_interval: float = CHECK_INTERVAL,
) -> None:
    """Hold a LISTEN connection until `stopped` is set, calling `wake()` on each notification."""
    failures = 0
    while not stopped.is_set():
        conn: asyncpg.Connection | None = None
        try:
            conn = await asyncpg.connect(
                **connect_args(
                    database_url,
                    application_name="jobqueue-worker-listen",
                    timeout=CONNECT_TIMEOUT,
                )
            )
            await conn.add_listener(NOTIFY_CHANNEL, lambda *_: wake())
            log.info("listening for wake-ups", extra={"channel": NOTIFY_CHANNEL})
            failures = 0
            wake()
            while not stopped.is_set():
                if await _wait(stopped, check_interval):
                    break
                async with asyncio.timeout(CHECK_TIMEOUT):
                    await conn.fetchval("SELECT 1")
        except Exception as exc:
            failures += 1
            if failures == 1:
                log.warning(
                    "wake-up listener lost", extra={"error": f"{type(exc).__name__}: {exc}"}
                )
            await _wait(stopped, min(_RETRY_FIRST * 2 ** min(failures - 1, 16), _RETRY_MAX))
        finally:
            if conn is not None:
                # terminate(), not close(): close() would wait on a half-open socket.
                conn.terminate()


async def _wait(event: asyncio.Event, seconds: float) -> bool:
    """Wait up to `seconds` for `event`; True if it is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()
