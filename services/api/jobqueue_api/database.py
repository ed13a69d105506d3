"""The API's engine and the line between "the database is unavailable" (503) and a bug (500).

Every bound here is short on purpose: a client waiting on a dead database
should get a 503 within seconds, not hang until a TCP timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator
from typing import Any

import sqlalchemy.exc as sa_exc
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore.db import make_engine

# Not a setting (docs/api.md, "Database connections"): one API process rarely benefits
# from more, and PostgreSQL's connection budget is shared with every worker.
POOL_SIZE = 10
CONNECT_TIMEOUT = 2.0
# Server-side bound on one statement; API statements take milliseconds.
STATEMENT_TIMEOUT = 2.5
# Client-side bound on every round trip, including the pool's pre-ping and
# ROLLBACK: a half-open connection (no RST, no answer) ends here. Longer than
# the statement timeout, so a merely slow statement is cancelled by the server.
COMMAND_TIMEOUT = 3.0
# Hard bound on the database part of one request, whatever the above missed.
REQUEST_DEADLINE = 5.0


def open_engine(url: str) -> AsyncEngine:
    """The API's engine. Every API request runs single statements (each store
    operation is one), so connections autocommit: no BEGIN/COMMIT round trips,
    one round trip per statement plus the pool's pre-ping."""
    engine = make_engine(
        url,
        pool_size=POOL_SIZE,
        connect_timeout=CONNECT_TIMEOUT,
        statement_timeout=STATEMENT_TIMEOUT,
        application_name="jobqueue-api",
        isolation_level="AUTOCOMMIT",
        # Waiting for a pooled connection is queueing behind busy requests, not an
        # outage: under a burst it may outlast CONNECT_TIMEOUT, so only the request
        # deadline bounds it.
        pool_timeout=REQUEST_DEADLINE,
    )

    @event.listens_for(engine.sync_engine, "do_connect")
    def _command_timeout(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        cparams["command_timeout"] = COMMAND_TIMEOUT

    return engine


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


# Errors that mean the statement reached the database and was wrong: a bug, not an outage.
_BUGS = (
    sa_exc.IntegrityError,
    sa_exc.DataError,
    sa_exc.ProgrammingError,
    sa_exc.NotSupportedError,
)


def is_unavailable(exc: BaseException) -> bool:
    """True when `exc` means the database could not be reached or did not answer in time."""
    if isinstance(exc, sa_exc.DBAPIError):
        return exc.connection_invalidated or not isinstance(exc, _BUGS)
    return isinstance(exc, OSError | asyncio.TimeoutError | sa_exc.TimeoutError)
