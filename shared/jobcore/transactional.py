"""Transactional enqueue: jobs written on the caller's own connection, in the caller's own
transaction, so a job exists (and wakes a worker) only if and when that transaction commits.

    with engine.begin() as conn:                      # SQLAlchemy, sync or async
        conn.execute(orders.insert().values(...))
        enqueue(conn, "send_receipt", {"order": 42})

`enqueue` and `enqueue_many` take a SQLAlchemy `Connection` or `AsyncConnection`, an
asyncpg connection (or pool proxy), or a psycopg `Connection` or `AsyncConnection`; for
the async kinds they return a coroutine to await. The driver is recognised by its class's
package, so psycopg and asyncpg are imported only by callers that pass their connections.

Items are checked by `jobcore.validation`, as the API checks them (the type must be
registered in this process), and written by `store.SUBMIT_MANY`, the statement of the
API's `POST /jobs/batch`, which takes no lock on a job an idempotency key replays (so an
open transaction does not hold up that job's worker); the workers' NOTIFY is sent in the
same transaction, so it is delivered at commit. Outside a transaction (asyncpg outside
`transaction()`, psycopg in autocommit mode) the statements run in one of their own,
committed before the call returns.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeAlias, overload
from uuid import UUID

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from jobcore import store, tracing, validation
from jobcore.errors import ConfigError, IdempotencyConflict
from jobcore.registry import BUILTIN_MODULES, registered_types
from jobcore.schema import jobs

if TYPE_CHECKING:
    import asyncpg
    import asyncpg.pool
    import psycopg
    from sqlalchemy.ext.asyncio import AsyncConnection

    SyncConnection: TypeAlias = sa.Connection | psycopg.Connection[Any]
    AsyncConnectionLike: TypeAlias = (
        AsyncConnection
        | asyncpg.Connection
        | asyncpg.pool.PoolConnectionProxy
        | psycopg.AsyncConnection[Any]
    )

# Undoes the rows SUBMIT_MANY just created in this transaction, when an item's idempotency
# key turned out to be bound to a different job: the batch is all or nothing.
_UNDO = sa.delete(jobs).where(
    jobs.c.id == sa.any_(sa.bindparam("ids", type_=pg.ARRAY(pg.UUID(as_uuid=True))))
)


# --- items ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    jobs: list[store.NewJob]  # as given, one per item
    rows: list[store.NewJob]  # what the statement inserts: the first item of each key
    payloads: list[str]  # each row's payload as JSON text


def _item(job_type: Any, payload: Any, fields: Mapping[str, Any]) -> dict[str, Any]:
    item = {"type": job_type, **fields}
    if payload is not None:
        item["payload"] = payload
    return item


def _jsonable(item: Any) -> tuple[Any, str]:
    """The item as the API would take it, and its payload as JSON text: a datetime `run_at`
    becomes its RFC 3339 text, a timedelta `delay`/`timeout` its seconds; a payload that
    JSON cannot carry (or jsonb cannot store) is refused as the API refuses it."""
    if type(item) is not dict and not isinstance(item, Mapping):
        return item, ""
    payload = item.get("payload", {})
    try:
        text = _encode(payload)
    except (TypeError, ValueError) as exc:
        raise validation.Invalid(f"field 'payload' is not JSON: {exc}") from None
    except RecursionError:
        raise validation.Invalid(
            f"JSON is nested deeper than {validation.MAX_DEPTH} levels"
        ) from None
    if not _surely_storable(text):
        validation.check_storable(payload)
    if not _PYTHON_VALUED.isdisjoint(item):
        item = _python_values(item)
    return item, text


def _encode(payload: Any) -> str:
    """The payload as JSON text. orjson, at a fifth of the standard encoder's cost, for what
    it writes as the standard one would; the standard one (which raises for what JSON
    cannot carry) for the rest: values orjson refuses (integers beyond 64 bits, keys that
    are not strings, lone surrogates, subclasses, datetimes), and NaN and the infinities,
    which orjson writes as null. (It also writes UUIDs and enum members as their values.)"""
    try:
        encoded = orjson.dumps(payload, option=_ORJSON_STRICT)
    except TypeError:  # orjson.JSONEncodeError is one
        return _JSON.encode(payload)
    if b"null" in encoded:
        return _JSON.encode(payload)
    return encoded.decode()


def _surely_storable(text: str) -> bool:
    """What `check_storable` would pass, read off the encoded text where that is quick: both
    encoders write U+0000 as \\u0000 and a lone surrogate only as a \\u escape (orjson
    refuses it), and a value cannot be nested deeper than it has brackets (those inside strings
    only add to the count)."""
    return "\\u" not in text and text.count("[") + text.count("{") <= validation.MAX_DEPTH


# One encoder for every payload: json.dumps with arguments would build one per call.
_JSON = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
_ORJSON_STRICT = (
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)
_PYTHON_VALUED = frozenset({"run_at", "delay", "timeout"})


def _python_values(item: Mapping[str, Any]) -> dict[str, Any]:
    """A datetime `run_at` as RFC 3339 text, a timedelta `delay`/`timeout` as seconds."""
    out = dict(item)
    run_at = out.get("run_at")
    if isinstance(run_at, datetime):
        if run_at.utcoffset() is None:
            raise validation.Invalid("field 'run_at' must be an aware datetime (with tzinfo)")
        out["run_at"] = run_at.isoformat()
    for name in ("delay", "timeout"):
        if isinstance(out.get(name), timedelta):
            out[name] = out[name].total_seconds()
    return out


_builtins_loaded = False


def _known_types() -> list[str]:
    """The types registered in this process, and the built-in ones, as the API knows them."""
    global _builtins_loaded
    if not _builtins_loaded:
        for name in BUILTIN_MODULES:
            importlib.import_module(name)
        _builtins_loaded = True
    return registered_types()


def _default_max_attempts() -> int:
    """MAX_ATTEMPTS from the environment, as the API reads it; else the API's default."""
    text = os.environ.get("MAX_ATTEMPTS")
    if text is None or not text.strip():
        from jobcore.settings import Settings

        default: int = Settings.model_fields["max_attempts"].default
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not validation.MIN_ATTEMPTS <= value <= validation.MAX_ATTEMPTS:
        raise ConfigError(
            "MAX_ATTEMPTS",
            f"must be an integer from {validation.MIN_ATTEMPTS} to {validation.MAX_ATTEMPTS}, "
            f"got {text!r}",
        )
    return value


def _plan(items: Sequence[Any]) -> _Plan:
    """Validate every item (all or none: `validation.Invalid`, a ValueError, naming each
    invalid item's index) and keep the first item of each idempotency key. A later item
    with the same key and a different request is an IdempotencyConflict."""
    texts: list[str] = []  # each item's payload as JSON, in order

    def prepare(item: Any) -> Any:
        prepared, text = _jsonable(item)
        texts.append(text)
        return prepared

    new_jobs = validation.new_items(
        items,
        known_types=_known_types(),
        default_max_attempts=_default_max_attempts(),
        prepare=prepare,
    )
    rows, first = store.batch_rows(new_jobs)
    payloads: list[str] = []
    for new, text in zip(new_jobs, texts, strict=True):
        key = new.idempotency_key
        if key is None or first[key] is new:
            payloads.append(text)
        elif not store.same_request(new, first[key]):
            raise IdempotencyConflict(key)
    return _Plan(new_jobs, rows, payloads)


def _write(plan: _Plan) -> tuple[Any, dict[str, Any]]:
    """The statement that writes the plan's rows, and its parameters: SUBMIT_MANY_KEYLESS
    when no item has an idempotency key (nothing to look up), else SUBMIT_MANY. The jobs
    carry the caller's current span, when it traces, for their attempts to link to
    (docs/operations.md#tracing)."""
    rows = plan.rows
    traceparent = tracing.current_traceparent()
    if traceparent is not None:
        rows = [new._replace(traceparent=traceparent) for new in rows]
    if all(new.idempotency_key is None for new in rows):
        return store.SUBMIT_MANY_KEYLESS, store.keyless_params(rows, plan.payloads)
    return store.SUBMIT_MANY, store.many_params(rows, plan.payloads)


@dataclass(frozen=True)
class _Outcome:
    ids: list[UUID]  # per item, in input order
    created: list[Any]  # the ids of the rows the statement inserted, as the driver gave them
    conflict: str | None  # a key bound to a different job: undo `created`, raise


def _uuid(job_id: Any) -> UUID:
    return job_id if type(job_id) is UUID else UUID(str(job_id))  # asyncpg has its own class


def _replays(plan: _Plan, rows: Sequence[Sequence[Any]]) -> tuple[Any, dict[str, Any]] | None:
    """SAME_REQUESTS and its parameters for the keyed rows SUBMIT_MANY did not create (their
    keys name stored jobs: replays or conflicts), or None when it created them all."""
    returned = {key for _, key, _ in rows}
    missing = [i for i, new in enumerate(plan.rows) if new.idempotency_key not in (None, *returned)]
    if not missing:
        return None
    rows_ = [plan.rows[i] for i in missing]
    payloads = [plan.payloads[i] for i in missing]
    return store.SAME_REQUESTS, store.many_params(rows_, payloads)


def _outcome(
    plan: _Plan, rows: Iterable[Sequence[Any]], replays: Iterable[Sequence[Any]] = ()
) -> _Outcome:
    """Read SUBMIT_MANY's rows (id, idempotency_key, created) and SAME_REQUESTS' (id,
    idempotency_key, same). A job without a key has the id it was given; only keyed ones
    may name a job that existed before."""
    by_key: dict[str, UUID] = {}
    created: list[Any] = []
    for job_id, key, _ in rows:
        if key is not None:
            by_key[key] = _uuid(job_id)
        created.append(job_id)
    for job_id, key, same in replays:
        if same:
            by_key[key] = _uuid(job_id)
    ids: list[UUID] = []
    for new in plan.jobs:
        key = new.idempotency_key
        if key is None:
            ids.append(new.id)
        elif key in by_key:
            ids.append(by_key[key])
        else:
            return _Outcome([], created, key)
    return _Outcome(ids, created, None)


# --- connections ------------------------------------------------------------------


class _Runner:
    """Runs jobcore's statements on one kind of connection: `fetch` returns the rows as
    tuples; `atomic` makes the statements one transaction when none is open."""

    is_async = False
    # Each kind's own: a plain function for the sync kinds, a coroutine function otherwise.
    fetch: Callable[[Any, Mapping[str, Any]], Any]

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def atomic(self) -> Any:
        return nullcontext()


def _refuse_autocommit(conn: Any) -> None:
    """A SQLAlchemy connection in AUTOCOMMIT commits each statement at once: the jobs would
    be visible (and run) before the caller's transaction decided, and a conflict could not
    be undone. (SQLAlchemy's own test, which reads the engine's isolation level too.)"""
    if getattr(conn, "_is_autocommit_isolation", lambda: False)():
        raise TypeError(
            "cannot enqueue on a SQLAlchemy connection in AUTOCOMMIT: it holds no "
            "transaction; pass one that does (engine.begin(), or engine.connect() without "
            "isolation_level='AUTOCOMMIT')"
        )


class _SqlAlchemy(_Runner):
    def __init__(self, conn: Any) -> None:
        _refuse_autocommit(conn)
        super().__init__(conn)

    def fetch(self, statement: Any, values: Mapping[str, Any]) -> list[Any]:
        result = self.conn.execute(statement, values)
        return list(result.all()) if result.returns_rows else []


class _SqlAlchemyAsync(_Runner):
    is_async = True

    def __init__(self, conn: Any) -> None:
        _refuse_autocommit(conn.sync_connection)
        super().__init__(conn)

    async def fetch(self, statement: Any, values: Mapping[str, Any]) -> list[Any]:
        result = await self.conn.execute(statement, values)
        return list(result.all()) if result.returns_rows else []


_compiled: dict[tuple[str, int], Any] = {}


def _for_asyncpg(statement: Any) -> Any:
    found = _compiled.get(("asyncpg", id(statement)))
    if found is None:
        from jobcore.compiled import Compiled

        found = _compiled[("asyncpg", id(statement))] = Compiled(statement)
    return found


class _Asyncpg(_Runner):
    is_async = True

    async def fetch(self, statement: Any, values: Mapping[str, Any]) -> list[Any]:
        compiled = _for_asyncpg(statement)
        return list(await self.conn.fetch(compiled.sql, *compiled.args(values)))

    def atomic(self) -> AbstractAsyncContextManager[Any]:
        if self.conn.is_in_transaction():
            return nullcontext()
        transaction: AbstractAsyncContextManager[Any] = self.conn.transaction()
        return transaction


def _for_psycopg(statement: Any, values: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    compiled = _compiled.get(("psycopg", id(statement)))
    if compiled is None:
        from sqlalchemy.dialects.postgresql.psycopg import dialect

        compiled = statement.compile(dialect=dialect())  # type: ignore[no-untyped-call]
        _compiled[("psycopg", id(statement))] = compiled
    sql: str = compiled.string
    return sql, dict(compiled.construct_params(values))


def _psycopg_idle(conn: Any) -> bool:
    """Autocommit and no transaction block open: each statement would commit on its own."""
    from psycopg.pq import TransactionStatus

    idle: bool = conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
    return idle


class _Psycopg(_Runner):
    def fetch(self, statement: Any, values: Mapping[str, Any]) -> list[Any]:
        from psycopg.rows import tuple_row

        sql, params = _for_psycopg(statement, values)
        with self.conn.cursor(row_factory=tuple_row) as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description is not None else []

    def atomic(self) -> AbstractContextManager[Any]:
        if _psycopg_idle(self.conn):
            transaction: AbstractContextManager[Any] = self.conn.transaction()
            return transaction
        return nullcontext()


class _PsycopgAsync(_Runner):
    is_async = True

    async def fetch(self, statement: Any, values: Mapping[str, Any]) -> list[Any]:
        from psycopg.rows import tuple_row

        sql, params = _for_psycopg(statement, values)
        async with self.conn.cursor(row_factory=tuple_row) as cursor:
            await cursor.execute(sql, params)
            return list(await cursor.fetchall()) if cursor.description is not None else []

    def atomic(self) -> AbstractAsyncContextManager[Any]:
        if _psycopg_idle(self.conn):
            transaction: AbstractAsyncContextManager[Any] = self.conn.transaction()
            return transaction
        return nullcontext()


# (package, class name) of a connection class or one of its bases -> how to run on it.
_RUNNERS: dict[tuple[str, str], Callable[[Any], _Runner]] = {
    ("sqlalchemy", "Connection"): _SqlAlchemy,
    ("sqlalchemy", "AsyncConnection"): _SqlAlchemyAsync,
    ("asyncpg", "Connection"): _Asyncpg,
    ("asyncpg", "_ConnectionProxy"): _Asyncpg,  # a pool's connection
    ("psycopg", "Connection"): _Psycopg,
    ("psycopg", "AsyncConnection"): _PsycopgAsync,
}


def _runner(conn: Any) -> _Runner:
    for cls in type(conn).__mro__:
        make = _RUNNERS.get((cls.__module__.partition(".")[0], cls.__qualname__))
        if make is not None:
            return make(conn)
    raise TypeError(
        f"cannot enqueue on a {type(conn).__module__}.{type(conn).__qualname__}: pass a "
        "SQLAlchemy Connection or AsyncConnection (for a Session: session.connection()), an "
        "asyncpg connection, or a psycopg Connection or AsyncConnection"
    )


# --- enqueue ------------------------------------------------------------------------


def _run(runner: _Runner, plan: _Plan) -> list[UUID]:
    statement, params = _write(plan)
    with runner.atomic():
        rows = runner.fetch(statement, params)
        if statement is store.SUBMIT_MANY_KEYLESS:
            runner.fetch(store.NOTIFY, {})
            return [new.id for new in plan.jobs]
        replays = _replays(plan, rows)
        found = runner.fetch(*replays) if replays is not None else []
        outcome = _outcome(plan, rows, found)
        if outcome.conflict is not None:
            if outcome.created:
                runner.fetch(_UNDO, {"ids": outcome.created})
            raise IdempotencyConflict(outcome.conflict)
        if outcome.created:
            runner.fetch(store.NOTIFY, {})
    return outcome.ids


async def _run_async(runner: _Runner, items: Sequence[Any]) -> list[UUID]:
    plan = _plan(items)
    if not plan.rows:
        return []
    fetch: Callable[[Any, Mapping[str, Any]], Awaitable[Any]] = runner.fetch
    statement, params = _write(plan)
    async with runner.atomic():
        rows = await fetch(statement, params)
        if statement is store.SUBMIT_MANY_KEYLESS:
            await fetch(store.NOTIFY, {})
            return [new.id for new in plan.jobs]
        replays = _replays(plan, rows)
        found = await fetch(*replays) if replays is not None else []
        outcome = _outcome(plan, rows, found)
        if outcome.conflict is not None:
            if outcome.created:
                await fetch(_UNDO, {"ids": outcome.created})
            raise IdempotencyConflict(outcome.conflict)
        if outcome.created:
            await fetch(store.NOTIFY, {})
    return outcome.ids


async def _first(ids: Awaitable[list[UUID]]) -> UUID:
    return (await ids)[0]


@overload
def enqueue_many(conn: SyncConnection, jobs: Iterable[Mapping[str, Any]]) -> list[UUID]: ...


@overload
def enqueue_many(
    conn: AsyncConnectionLike, jobs: Iterable[Mapping[str, Any]]
) -> Coroutine[Any, Any, list[UUID]]: ...


def enqueue_many(conn: Any, jobs: Iterable[Mapping[str, Any]]) -> Any:
    """Write `jobs` (create items as the API's batch takes them: `type`, `payload`,
    `max_attempts`, `queue`, `priority`, `run_at` or `delay`, `timeout`, `idempotency_key`)
    in the transaction open on `conn`, with one statement. Returns their ids in input order
    (a coroutine of them, for an async connection); an item whose idempotency key names an
    existing job of the same request gets that job's id.

    Raises `validation.Invalid` (a ValueError) naming every invalid item, and
    `IdempotencyConflict` when a key is bound to a different request; either way the
    transaction holds none of these jobs.
    """
    runner = _runner(conn)
    items = list(jobs)
    if runner.is_async:
        return _run_async(runner, items)
    plan = _plan(items)
    return _run(runner, plan) if plan.rows else []


@overload
def enqueue(conn: SyncConnection, type: str, payload: Any = None, **fields: Any) -> UUID: ...


@overload
def enqueue(
    conn: AsyncConnectionLike, type: str, payload: Any = None, **fields: Any
) -> Coroutine[Any, Any, UUID]: ...


def enqueue(conn: Any, type: str, payload: Any = None, **fields: Any) -> Any:
    """Write one job of `type` in the transaction open on `conn`; returns its id (a coroutine
    of it, for an async connection). `payload` defaults to `{}`; `fields` are the create
    request's (`max_attempts`, `queue`, `priority`, `run_at` as an aware datetime or RFC 3339
    text, `delay` and `timeout` as seconds, a timedelta or a duration such as "90s") and
    `idempotency_key`. Raises as `enqueue_many` does."""
    ids = enqueue_many(conn, [_item(type, payload, fields)])
    if isinstance(ids, list):
        return ids[0]
    return _first(ids)
