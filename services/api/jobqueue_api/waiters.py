"""Waiting for a job to finish (`GET /jobs/{id}?wait=`): one LISTEN connection per process.

A waiter holds no database connection while it waits. It registers a future under its
job id, makes sure the process is listening on `queries.FINISHED_CHANNEL`, then marks the
job as awaited (`control.watch`, one short statement), and only then awaits the future:
a write that finishes an awaited job notifies with its id at commit, and the
notification resolves every future registered under that id. In that order no finish
is missed: one that commits before the mark is seen by the mark itself (it returns
False: nothing to wait for), one that commits after it notifies a channel already
listened on.

The listening connection is opened on the first wait or readiness probe (`start`) and
kept, checked every few seconds (`SELECT 1` under a short timeout, which also catches a
half-open socket), and re-established with backoff when it breaks. Notifications sent
while nobody listened are lost, so after every reconnection each waiter is woken to mark
its job again, which also tells it whether the job finished meanwhile. A connection that
answers may still hear nothing (a pooler in transaction mode on its way): the
notification check (`jobcore.notifications`) runs after every connect and then every
CHECK_INTERVAL of its own, and until it has heard, each waiter also reads its job every
WAIT_POLL_INTERVAL. On shutdown every waiter is answered at once with the job as it is
(`release`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from enum import Enum
from typing import Any
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import control, queries, store
from jobcore.backoff import Retry
from jobcore.db import connect, connect_args, session_name
from jobcore.errors import describe
from jobcore.ids import parse_id
from jobcore.notifications import NOTIFICATION_SEND, OK, UNHEARD, NotificationCheck
from jobcore.rows import Job
from jobcore.states import FINISHED
from jobqueue_api import metrics
from jobqueue_api.database import CONNECT_TIMEOUT, REQUEST_DEADLINE, in_turn

log = logging.getLogger("jobqueue.api")

CHECK_INTERVAL = 5.0
CHECK_TIMEOUT = 2.0
# While notifications are not known to be heard, a waiter reads its job this often.
WAIT_POLL_INTERVAL = 1.0


class Wake(Enum):
    """Why a waiter's future was resolved."""

    FINISHED = "finished"  # the job's finishing write notified
    RELISTENED = "relistened"  # the listener reconnected: notifications may have been lost
    RELEASED = "released"  # shutdown: answer now


class Waiters:
    """The process's waiters, by job id, and the connection that listens for them."""

    def __init__(self, database_url: str, engine: AsyncEngine | None = None) -> None:
        self._database_url = database_url
        self._waiting: dict[UUID, set[asyncio.Future[Wake]]] = {}
        self._listening = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._conn: Any = None  # asyncpg.Connection while connected
        self._released = False
        # Without an engine to send it through (a bare test), no check: waits trust the
        # listener.
        self.notifications = (
            None
            if engine is None
            else NotificationCheck(
                lambda token: _send(engine, token),
                listener="jobqueue-api",
                checked=_count_unheard,
            )
        )

    @property
    def count(self) -> int:
        """How many requests are waiting now."""
        return sum(len(futures) for futures in self._waiting.values())

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    def start(self) -> None:
        """Start listening now rather than at the first wait (the notification check, which
        `/readyz` shows, runs from then on)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._listen())

    async def wait(self, engine: AsyncEngine, job_id: UUID, seconds: float) -> Job | None:
        """The job once it has finished, or as it is after `seconds`; None if unknown.

        Raises TimeoutError when the listener cannot be (re)established in time (the
        database is unavailable)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not self._released:
            woken: asyncio.Future[Wake] = loop.create_future()
            self._waiting.setdefault(job_id, set()).add(woken)
            try:
                if not await self._until_listening(deadline):
                    break
                if not await _watch(engine, job_id):
                    break  # finished already, or no such job
                heard = self.notifications is None or self.notifications.state == OK
                until = deadline if heard else min(deadline, loop.time() + WAIT_POLL_INTERVAL)
                try:
                    async with asyncio.timeout_at(until):
                        await woken
                except TimeoutError:
                    if until >= deadline:
                        break
                    continue  # marks the job again, which says whether it finished
            finally:
                self._forget(job_id, woken)
            if woken.result() is Wake.FINISHED:
                job = await _read(engine, job_id)
                # A job retried between its finish and this read waits again.
                if job is None or job.status in FINISHED or loop.time() >= deadline:
                    return job
        return await _read(engine, job_id)

    def release(self) -> None:
        """Answer every waiter now, and every later one at once (shutdown)."""
        self._released = True
        self._wake_all(Wake.RELEASED)

    async def close(self) -> None:
        """Release the waiters and close the listening connection."""
        self.release()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # --- the waiters' side -------------------------------------------------------

    async def _until_listening(self, deadline: float) -> bool:
        """Wait for the listener; False if the wait's deadline came first. Raises
        TimeoutError after REQUEST_DEADLINE, as a database statement would."""
        if self._listening.is_set():
            return True
        self.start()
        loop = asyncio.get_running_loop()
        limit = min(deadline, loop.time() + REQUEST_DEADLINE)
        try:
            async with asyncio.timeout_at(limit):
                await self._listening.wait()
        except TimeoutError:
            if loop.time() >= deadline:
                return False
            raise TimeoutError("not listening for finished jobs: database unavailable") from None
        return True

    def _forget(self, job_id: UUID, woken: asyncio.Future[Wake]) -> None:
        futures = self._waiting.get(job_id)
        if futures is not None:
            futures.discard(woken)
            if not futures:
                del self._waiting[job_id]

    def _wake_all(self, why: Wake) -> None:
        for futures in self._waiting.values():
            for future in futures:
                if not future.done():
                    future.set_result(why)

    def _notified(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        job_id = parse_id(payload)
        for future in self._waiting.get(job_id, ()) if job_id is not None else ():
            if not future.done():
                future.set_result(Wake.FINISHED)

    # --- the listening connection -------------------------------------------------

    async def _listen(self) -> None:
        retry = Retry(0.1, 5.0)
        connected_before = False
        while True:
            try:
                await self._connect()
                if connected_before:
                    self._wake_all(Wake.RELISTENED)
                connected_before = True
                retry.succeeded()
                await self._check_until_broken()
            except Exception as exc:
                if retry.failures == 0:
                    log.warning("not listening for finished jobs", extra={"error": describe(exc)})
            finally:
                self._disconnect()
            await asyncio.sleep(retry.failed())

    async def _connect(self) -> None:
        conn = await connect(
            **connect_args(
                self._database_url,
                application_name=session_name("jobqueue-api-listen"),
                timeout=CONNECT_TIMEOUT,
            )
        )
        self._conn = conn
        await conn.add_listener(queries.FINISHED_CHANNEL, self._notified)
        if self.notifications is not None:
            await self.notifications.attach(conn)
        self._listening.set()
        log.info("listening for finished jobs", extra={"channel": queries.FINISHED_CHANNEL})

    async def _check_until_broken(self) -> None:
        """Returns never; raises when the connection is closed or stops answering."""
        closed = asyncio.Event()
        self._conn.add_termination_listener(lambda _conn: closed.set())
        check = self.notifications
        while True:
            if check is not None and check.due():
                try:
                    await check.run()
                except Exception as exc:  # not sent: says nothing of the listener
                    log.debug("notification check not sent", extra={"error": describe(exc)})
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CHECK_INTERVAL):
                    await closed.wait()
            if closed.is_set() or self._conn.is_closed():
                raise ConnectionError("the listening connection was closed")
            async with asyncio.timeout(CHECK_TIMEOUT):
                await self._conn.fetchval("SELECT 1")

    def _disconnect(self) -> None:
        self._listening.clear()
        if self._conn is not None:
            # terminate(), not close(): close() would wait on a half-open socket.
            self._conn.terminate()
            self._conn = None


def _count_unheard(verdict: str) -> None:
    if verdict == UNHEARD:
        metrics.NOTIFICATIONS_UNHEARD.inc()


async def _send(engine: AsyncEngine, token: str) -> None:
    async with asyncio.timeout(REQUEST_DEADLINE), in_turn(engine), engine.connect() as conn:
        await conn.execute(NOTIFICATION_SEND, {"token": token})


async def _watch(engine: AsyncEngine, job_id: UUID) -> bool:
    async with asyncio.timeout(REQUEST_DEADLINE), in_turn(engine), engine.connect() as conn:
        return await control.watch(conn, job_id)


async def _read(engine: AsyncEngine, job_id: UUID) -> Job | None:
    async with asyncio.timeout(REQUEST_DEADLINE), in_turn(engine), engine.connect() as conn:
        return await store.get(conn, job_id)
