"""The API's engine, its pooled connections taken in turn (through SQLAlchemy, or as the
asyncpg connections the hot calls run on: `on_driver`), and the line between "the database
is unavailable" (503) and a bug (500).

Every bound here is short on purpose: a client waiting on a dead database
should get a 503 within seconds, not hang until a TCP timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import sqlalchemy.exc as sa_exc
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection

from jobcore.db import make_engine, on_read_only_server, session_name
from jobcore.runner import Driver
from jobqueue_api import jsonio

# Not a setting (docs/api.md, "Database connections"): one API process rarely benefits
# from more, and PostgreSQL's connection budget is shared with every worker.
POOL_SIZE = 10
CONNECT_TIMEOUT = 2.0
# Bound on every round trip, including ROLLBACK; API statements take milliseconds. A slow
# statement is cancelled on the server when it runs out (asyncpg sends a cancel request,
# which a pooler passes on), and a half-open connection (no RST, no answer) ends here. Not
# a session `statement_timeout`: the connections commit each statement on their own, so
# there is no transaction to SET LOCAL it in, and a session setting, or a startup
# parameter, is what a pooler in transaction mode shares with other clients or refuses.
COMMAND_TIMEOUT = 2.5
# Hard bound on the database part of one request, whatever the above missed.
REQUEST_DEADLINE = 5.0


def open_engine(url: str) -> AsyncEngine:
    """The API's engine. Every API request runs single statements (each store
    operation is one), so connections autocommit: no BEGIN/COMMIT round trips, one
    round trip per statement.

    No pre-ping (a round trip per checkout): a pooled connection whose server end is
    known to be gone (the server restarted, or the backend was terminated) is replaced at
    checkout at no cost, and the hot calls retry once a call whose connection died under
    it (`on_driver`)."""
    engine = make_engine(
        url,
        pool_size=POOL_SIZE,
        connect_timeout=CONNECT_TIMEOUT,
        pre_ping=False,
        application_name=session_name("jobqueue-api"),
        isolation_level="AUTOCOMMIT",
        # Waiting for a pooled connection is queueing behind busy requests, not an
        # outage: under a burst it may outlast CONNECT_TIMEOUT, so only the request
        # deadline bounds it.
        pool_timeout=REQUEST_DEADLINE,
        # jsonb values (payloads, results) decoded with orjson, to the same values.
        json_deserializer=jsonio.loads,
    )

    @event.listens_for(engine.sync_engine, "do_connect")
    def _command_timeout(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        cparams["command_timeout"] = COMMAND_TIMEOUT

    @event.listens_for(engine.sync_engine.pool, "checkout")
    def _alive(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        if closed(dbapi_connection.driver_connection):
            # The pool replaces it with a new connection (a connect, never a 503).
            raise sa_exc.DisconnectionError("the pooled connection was closed by the server")

    return engine


def closed(conn: asyncpg.Connection) -> bool:
    """Whether a pooled connection is known to be gone (its server end closed it, and the
    event loop has seen that); checked at every checkout, it costs no round trip."""
    gone: bool = conn.is_closed()
    return gone


_turns: weakref.WeakKeyDictionary[Any, asyncio.Semaphore] = weakref.WeakKeyDictionary()


@contextlib.asynccontextmanager
async def in_turn(engine: AsyncEngine) -> AsyncIterator[None]:
    """Wait for a pooled connection (of an `open_engine` engine) in arrival order; check
    it out inside this block.

    SQLAlchemy's async pool lets a request arriving just as a connection is returned
    take it ahead of the waiter that was woken for it, which then queues again at
    the back. Under a burst some requests starved past REQUEST_DEADLINE (503s while
    the database was fine); a first-come-first-served gate of the pool's size
    (asyncio.Semaphore is fair) keeps the waits even.
    """
    turn = _turns.get(engine.sync_engine)
    if turn is None:
        turn = _turns[engine.sync_engine] = asyncio.Semaphore(POOL_SIZE)
    async with turn:
        yield


_T = TypeVar("_T")
# A call that ended with one of these (or was cancelled) may have left its connection
# mid-exchange.
_UNKNOWN_STATE = (TimeoutError, OSError, asyncpg.InterfaceError, asyncpg.InternalClientError)


async def on_driver(
    engine: AsyncEngine, call: Callable[[Driver, bool], Awaitable[_T]], *, retry: bool
) -> _T:
    """`call(conn, again)` on the asyncpg connection of one of `engine`'s pooled
    connections, taken in turn (`in_turn`): the same pool and budget as every other
    request, without SQLAlchemy's per-statement work.

    A connection the call may have left mid-exchange (cut short by a timeout or a
    cancellation, or broken) is discarded, never reused. With
    `retry`, a call whose connection turned out dead (closed when it failed: the server
    restarted, the backend was terminated) or that was on a read-only server runs once more
    on a fresh connection, with
    `again` True; only for calls that are safe to repeat even if the first one applied
    (a read; a submit, which finds its own job again by its id).
    """
    async with in_turn(engine):
        again = False
        while True:
            pooled = await _checkout(engine)
            conn: asyncpg.Connection = pooled.driver_connection
            try:
                result = await call(conn, again)
            except BaseException as exc:
                dead = conn.is_closed()
                # On a read-only server (a standby the URL let it reach): refused before
                # anything was written, and never to be used for writes again.
                wrong_server = isinstance(exc, Exception) and on_read_only_server(exc)
                if dead or wrong_server:
                    # What SQLAlchemy does when one of its connections finds the server gone:
                    # every connection made before now is replaced at its next checkout, as
                    # the server that held them may be gone too (a restart, a failover).
                    engine.sync_engine.pool._invalidate(pooled, exc)
                elif not isinstance(exc, Exception) or isinstance(exc, _UNKNOWN_STATE):
                    pooled.invalidate(exc)  # closes it and gives its slot back
                else:  # an error the server reported, or the call's own: the exchange ended
                    pooled.close()
                if retry and (dead or wrong_server) and not again and isinstance(exc, Exception):
                    again = True
                    continue
                raise
            pooled.close()
            return result


async def _checkout(engine: AsyncEngine) -> PoolProxiedConnection:
    """A pooled connection; a failure to connect raised as `engine.connect()` raises it."""
    dialect = engine.dialect
    try:
        return await engine.raw_connection()
    except dialect.loaded_dbapi.Error as exc:
        raise sa_exc.DBAPIError.instance(
            None,
            None,
            exc,
            dialect.loaded_dbapi.Error,
            connection_invalidated=dialect.is_disconnect(exc, None, None),
            dialect=dialect,
        ) from exc


# Errors that mean the statement reached the database and was wrong: a bug, not an outage.
_BUGS = (
    sa_exc.IntegrityError,
    sa_exc.DataError,
    sa_exc.ProgrammingError,
    sa_exc.NotSupportedError,
)
# asyncpg's errors (the hot calls, `on_driver`), classified as they are when SQLAlchemy's
# asyncpg dialect wraps them: these become IntegrityError, ProgrammingError and
# NotSupportedError; every other one an error that counts as an outage.
_DRIVER_BUGS = (
    asyncpg.IntegrityConstraintViolationError,
    asyncpg.SyntaxOrAccessError,
    asyncpg.InvalidCachedStatementError,
)
_DRIVER_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)


def is_unavailable(exc: BaseException) -> bool:
    """True when `exc` means the database could not be reached or did not answer in time."""
    if isinstance(exc, sa_exc.DBAPIError):
        return exc.connection_invalidated or not isinstance(exc, _BUGS)
    if isinstance(exc, _DRIVER_ERRORS):
        return not isinstance(exc, _DRIVER_BUGS)
    return isinstance(exc, OSError | asyncio.TimeoutError | sa_exc.TimeoutError)
