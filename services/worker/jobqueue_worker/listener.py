"""LISTEN/NOTIFY: one listening connection per worker process, for wake-ups, cancels and
pauses.

Submissions notify `jobcore.queries.NOTIFY_CHANNEL`; each notification wakes the
dispatcher at once instead of after POLL_INTERVAL. A cancel request for a
running job notifies `jobcore.control.CANCEL_CHANNEL` with the job's id; the
process that runs the job stops its attempt, the others ignore it (a lost one
is caught by the next heartbeat, `jobqueue_worker.heartbeat`). A queue paused or resumed
notifies `jobcore.pauses.PAUSE_CHANNEL`: the process re-reads its paused queues
(`jobqueue_worker.pauses`; a lost one is caught by that loop's poll). A notification is only a
hint (polling stays the fallback), but a listener that silently stopped
hearing would turn every pickup into a poll and delay every cancel to a heartbeat.
So a connection the server closed (terminated, restarted) is noticed at once, by
asyncpg's termination callback, and re-established at once, then with backoff; and
the connection is checked with a `SELECT 1` under a short timeout every few seconds,
which catches a half-open connection (no RST, no answer). After every (re)connect,
since notifications sent while nobody listened are lost, the dispatcher is woken
(`wake`: due jobs) and `reconnected` is called (the heartbeat, which re-reads the
cancel requests of the jobs running here). A connection that answers may still hear
nothing (a pooler in transaction mode on its way): the notification check
(`jobcore.notifications`) runs after every connect and every CHECK_INTERVAL of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any
from uuid import UUID

import asyncpg

from jobcore.backoff import Retry
from jobcore.control import CANCEL_CHANNEL
from jobcore.db import connect, connect_args, session_name
from jobcore.errors import describe
from jobcore.notifications import NotificationCheck
from jobcore.pauses import PAUSE_CHANNEL
from jobcore.queries import NOTIFY_CHANNEL
from jobqueue_worker.loops import Loop

log = logging.getLogger("jobqueue.worker")

CHECK_INTERVAL = 5.0
CHECK_TIMEOUT = 2.0
CONNECT_TIMEOUT = 5.0


class Listener(Loop):
    """Holds the LISTEN connection, calling `wake()` on each wake-up and `cancel(job id)` on
    each cancel request. Each round connects if there is no connection, else checks the
    one there is."""

    name = "listener"

    def __init__(
        self,
        database_url: str,
        wake: Callable[[], None],
        check_interval: float = CHECK_INTERVAL,
        cancel: Callable[[UUID], object] | None = None,
        reconnected: Callable[[], None] = lambda: None,
        pauses: Callable[[], None] | None = None,
        notifications: NotificationCheck | None = None,
    ) -> None:
        super().__init__(check_interval, Retry(0.25, 5.0))
        self._database_url = database_url
        self._wake = wake
        self._cancel = cancel
        self._reconnected = reconnected
        self._pauses = pauses
        self._conn: asyncpg.Connection | None = None
        self._connected_once = False
        self._notifications = notifications
        self._checking: asyncio.Task[bool] | None = None

    async def run_once(self) -> None:
        conn = self._conn
        try:
            if conn is None:
                await self._connect()
            else:
                async with asyncio.timeout(CHECK_TIMEOUT):
                    await conn.fetchval("SELECT 1")
            self._check_notifications()
        except Exception:
            if conn is not None and conn is not self._conn:
                return  # its end was heard already (`_terminated`): the next round reconnects
            self.close()
            raise
        except BaseException:
            self.close()
            raise

    async def _connect(self) -> None:
        self._conn = await connect(
            **connect_args(
                self._database_url,
                application_name=session_name("jobqueue-worker-listen"),
                timeout=CONNECT_TIMEOUT,
            )
        )
        self._conn.add_termination_listener(self._terminated)
        channels = [NOTIFY_CHANNEL]
        try:
            if self._notifications is not None:
                await self._notifications.attach(self._conn)
            await self._conn.add_listener(NOTIFY_CHANNEL, lambda *_: self._wake())
            if self._cancel is not None:
                await self._conn.add_listener(CANCEL_CHANNEL, self._cancel_requested)
                channels.append(CANCEL_CHANNEL)
            if self._pauses is not None:
                pauses = self._pauses
                await self._conn.add_listener(PAUSE_CHANNEL, lambda *_: pauses())
                channels.append(PAUSE_CHANNEL)
        except asyncpg.InternalClientError as exc:
            # A backend killed between the connect and the first LISTEN: asyncpg is still
            # taking in the server's last error when the LISTEN starts, and says so as a busy
            # connection. It is a lost connection (dropped like any other), never used again.
            raise ConnectionError("the connection was closed while it was set up") from exc
        log.info("listening for wake-ups", extra={"channel": NOTIFY_CHANNEL, "channels": channels})
        # Notifications sent while nobody listened are lost: look for due jobs, and for
        # cancel requests of running jobs, and for paused queues, now.
        self._wake()
        if self._pauses is not None:
            self._pauses()
        if self._connected_once:
            self._reconnected()
        self._connected_once = True

    def _check_notifications(self) -> None:
        """Start the notification check if it is due and not running (it takes up to its
        timeout, which the rounds must not wait for)."""
        check = self._notifications
        if check is None or not check.due() or (self._checking and not self._checking.done()):
            return
        self._checking = asyncio.create_task(check.run(), name="notification-check")
        self._checking.add_done_callback(_checked)

    def _terminated(self, conn: Any) -> None:
        if conn is not self._conn:
            return  # one this listener closed itself
        self._conn = None
        log.warning("wake-up listener lost", extra={"error": "the connection was closed"})
        self.nudge()

    def _cancel_requested(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        assert self._cancel is not None
        try:
            job_id = UUID(payload)
        except ValueError:
            log.warning("malformed cancel request ignored", extra={"payload": payload[:100]})
            return
        self._cancel(job_id)

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
            if self._checking is not None:
                self._checking.cancel()


def _checked(task: asyncio.Task[bool]) -> None:
    # A check whose notification could not be sent (the database unavailable) says nothing
    # of the listener; the next round tries again.
    failure = None if task.cancelled() else task.exception()
    if failure is not None:
        log.debug("notification check not sent", extra={"error": describe(failure)})
