"""The notification check: does a LISTEN connection hear what the service sends?

A service's LISTEN connection (DATABASE_LISTEN_URL) and the connections it sends its
notifications on (DATABASE_URL) may be different paths to the database. Through a pooler
in transaction mode, a LISTEN is issued on whichever server connection the pooler lent
for that moment, and what is notified to it later is dropped: the listener says it
listens, and hears nothing. So after every (re)connect, and every CHECK_INTERVAL, the
listener sends itself a notification through the service's ordinary connections
(`NOTIFICATION_SEND`, a token on `CHECK_CHANNEL`) and waits CHECK_TIMEOUT for it.
`NotificationCheck.state` is the latest verdict (`OK`, `UNHEARD`, `UNCHECKED`), which
`/readyz` shows; a check that heard nothing is counted, and logged when the verdict
changes. The services keep working by polling while notifications go unheard.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import uuid4

import sqlalchemy as sa

CHECK_CHANNEL = "jobqueue_check"
CHECK_INTERVAL = 30.0
CHECK_TIMEOUT = 5.0

OK, UNHEARD, UNCHECKED = "ok", "unheard", "unchecked"

NOTIFICATION_SEND: Any = sa.select(
    sa.func.pg_notify(
        sa.literal_column(f"'{CHECK_CHANNEL}'"), sa.bindparam("token", type_=sa.Text)
    ).label("sent")
)

log = logging.getLogger("jobqueue")

Send = Callable[[str], Awaitable[object]]


class NotificationCheck:
    """One listener's check: `attach` it to each new LISTEN connection, then `run` it
    (`due` says when again); `checked(verdict)` is called after every check (to count the
    unheard ones, and pass the verdict on)."""

    def __init__(
        self,
        send: Send,
        *,
        listener: str,
        checked: Callable[[str], object] = lambda verdict: None,
        timeout: float = CHECK_TIMEOUT,
        interval: float = CHECK_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = UNCHECKED
        self._send = send
        self._listener = listener
        self._checked = checked
        self._timeout = timeout
        self._interval = interval
        self._clock = clock
        self._checked_at: float | None = None
        self._waiting: dict[str, asyncio.Future[None]] = {}

    async def attach(self, conn: Any) -> None:
        """Listen on CHECK_CHANNEL on `conn` (an asyncpg connection); a new connection has
        not been checked yet."""
        await conn.add_listener(CHECK_CHANNEL, self._heard)
        self._checked_at = None

    def due(self) -> bool:
        return self._checked_at is None or self._clock() - self._checked_at >= self._interval

    async def run(self) -> bool:
        """Send a token and wait for it; whether it was heard. A send that fails (the
        database unavailable) raises, and says nothing about the listener."""
        token = uuid4().hex
        heard: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[token] = heard
        try:
            await self._send(token)
            try:
                async with asyncio.timeout(self._timeout):
                    await heard
            except TimeoutError:
                return self._verdict(False)
            return self._verdict(True)
        finally:
            self._waiting.pop(token, None)

    def _verdict(self, heard: bool) -> bool:
        self._checked_at = self._clock()
        before, self.state = self.state, OK if heard else UNHEARD
        self._checked(self.state)
        if not heard:
            if before != UNHEARD:
                log.warning(
                    "notifications unheard",
                    extra={
                        "listener": self._listener,
                        "timeout": self._timeout,
                        "hint": "a pooler in transaction mode between the listener and the "
                        "database drops them: point DATABASE_LISTEN_URL at the database; "
                        "polling goes on meanwhile",
                    },
                )
        elif before == UNHEARD:
            log.info("notifications heard again", extra={"listener": self._listener})
        return heard

    def _heard(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        future = self._waiting.get(payload)
        if future is not None and not future.done():
            future.set_result(None)
