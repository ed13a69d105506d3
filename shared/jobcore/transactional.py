"""Transactional enqueue: jobs written on the caller's own connection, in the caller's own
transaction, so a job exists (and wakes a worker) only if and when that transaction commits.

    with engine.begin() as conn:                      # SQLAlchemy, sync or async
        conn.execute(orders.insert().values(...))
        enqueue(conn, "send_receipt", {"order": 42})

`enqueue` and `enqueue_many` take a SQLAlchemy `Connection` or `AsyncConnection`, an
asyncpg connection (or pool proxy), or a psycopg `Connection` or `AsyncConnection`; for
the async kinds they return a coroutine to await. The driver is recognised by its class's
package, so psycopg and asyncpg are imported only by callers that pass their connections.

Items are checked by `jobcore.validation`, as the API checks them: the type must be
registered in this process or recorded in `job_types` by a worker of the database (read on
`conn`, only for types this process has no handler for), and a field an item omits takes
the handler's option (this process's handler's, else the recorded one). They are written
by `queries.JOB_SUBMIT_MANY`, the statement of the API's `POST /jobs/batch`, which takes no
lock on a job an idempotency key replays (so an open transaction does not hold up that
job's worker); the workers' NOTIFY is sent in the
same transaction, so it is delivered at commit. Outside a transaction (asyncpg outside
`transaction()`, psycopg in autocommit mode) the statements run in one of their own,
committed before the call returns.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeAlias, overload
from uuid import UUID

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from jobcore import catalog, connections, environ, idempotency, queries, tracing, validation
from jobcore.errors import ConfigError, IdempotencyConflict, InvalidRequest
from jobcore.queries.job_types import record_from_row
from jobcore.registry import BUILTIN_MODULES, known
from jobcore.rows import NewJob, Row
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

# Undoes the rows JOB_SUBMIT_MANY just created in this transaction, when an item's idempotency
# key turned out to be bound to a different job: the batch is all or nothing.
_UNDO = sa.delete(jobs).where(
    jobs.c.id == sa.any_(sa.bindparam("ids", type_=pg.ARRAY(pg.UUID(as_uuid=True))))
)


# --- items ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    jobs: list[NewJob]  # as given, one per item
    rows: list[NewJob]  # what the statement inserts: the first item of each key
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
        raise InvalidRequest(f"field 'payload' is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequest(f"JSON is nested deeper than {validation.MAX_DEPTH} levels") from None
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
            raise InvalidRequest("field 'run_at' must be an aware datetime (with tzinfo)")
        out["run_at"] = run_at.isoformat()
    for name in ("delay", "timeout"):
        if isinstance(out.get(name), timedelta):
            out[name] = out[name].total_seconds()
    return out


_builtins_loaded = False


def _known_types() -> frozenset[str]:
    """The types registered in this process, and the built-in ones, as the API knows them."""
    global _builtins_loaded
    if not _builtins_loaded:
        for name in BUILTIN_MODULES:
            importlib.import_module(name)
        _builtins_loaded = True
    return known()[0]


def _lookup(items: Sequence[Any]) -> tuple[Any, dict[str, Any]] | None:
    """JOB_TYPE_FIND and its parameters for the types of `items` this process has no handler
    for (a worker may have recorded them), or None when it has them all."""
    local = _known_types()
    missing = {
        item["type"]
        for item in items
        if isinstance(item, Mapping)
        and isinstance(item.get("type"), str)
        and item["type"] not in local
    }
    if not missing:
        return None
    return queries.JOB_TYPE_FIND, {"types": sorted(missing), "max_age": catalog.MAX_AGE}


def _default_max_attempts() -> int:
    """MAX_ATTEMPTS (or JOBQUEUE_MAX_ATTEMPTS) from the environment, as the API reads it; else
    the API's default."""
    found = environ.lookup("MAX_ATTEMPTS")
    if found is None or not found[1].strip():
        return validation.DEFAULT_MAX_ATTEMPTS
    variable, text = found
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not validation.MIN_ATTEMPTS <= value <= validation.MAX_ATTEMPTS:
        raise ConfigError(
            variable.upper(),
            f"must be an integer from {validation.MIN_ATTEMPTS} to {validation.MAX_ATTEMPTS}, "
            f"got {text!r}",
        )
    return value


def _plan(items: Sequence[Any], records: Iterable[Row] = ()) -> _Plan:
    """Validate every item against this process's types and the `records` JOB_TYPE_FIND
    read (all or none: `InvalidRequest`, a ValueError, naming each invalid item's index)
    and keep the first item of each idempotency key. A later item with the same key and a
    different request is an IdempotencyConflict."""
    texts: list[str] = []  # each item's payload as JSON, in order

    def prepare(item: Any) -> Any:
        prepared, text = _jsonable(item)
        texts.append(text)
        return prepared

    accepted = catalog.merged((), [record_from_row(row) for row in records])
    new_jobs = validation.new_items(
        items,
        known_types=accepted.types,
        default_max_attempts=_default_max_attempts(),
        prepare=prepare,
        options=accepted.options,
    )
    rows, first = idempotency.batch_rows(new_jobs)
    payloads: list[str] = []
    for new, text in zip(new_jobs, texts, strict=True):
        key = new.idempotency_key
        if key is None or first[key] is new:
            payloads.append(text)
        elif not idempotency.same_request(new, first[key]):
            raise IdempotencyConflict(key)
    return _Plan(new_jobs, rows, payloads)


def _write(plan: _Plan) -> tuple[Any, dict[str, Any]]:
    """The statement that writes the plan's rows, and its parameters: JOB_SUBMIT_MANY_KEYLESS
    when no item has an idempotency key (nothing to look up), else JOB_SUBMIT_MANY. The jobs
    carry the caller's current span, when it traces, for their attempts to link to
    (docs/operations.md#tracing)."""
    rows = plan.rows
    traceparent = tracing.current_traceparent()
    if traceparent is not None:
        rows = [new._replace(traceparent=traceparent) for new in rows]
    if all(new.idempotency_key is None for new in rows):
        return queries.JOB_SUBMIT_MANY_KEYLESS, queries.keyless_params(rows, plan.payloads)
    return queries.JOB_SUBMIT_MANY, queries.many_params(rows, plan.payloads)


@dataclass(frozen=True)
class _Outcome:
    ids: list[UUID]  # per item, in input order
    created: list[Any]  # the ids of the rows the statement inserted, as the driver gave them
    conflict: str | None  # a key bound to a different job: undo `created`, raise


def _uuid(job_id: Any) -> UUID:
    return job_id if type(job_id) is UUID else UUID(str(job_id))  # asyncpg has its own class


def _replays(plan: _Plan, rows: Sequence[Row]) -> tuple[Any, dict[str, Any]] | None:
    """JOB_MATCH_REQUESTS and its parameters for the keyed rows JOB_SUBMIT_MANY did not create
    (their keys name stored jobs: replays or conflicts), or None when it created them all."""
    returned = {row["idempotency_key"] for row in rows}
    missing = [i for i, new in enumerate(plan.rows) if new.idempotency_key not in (None, *returned)]
    if not missing:
        return None
    replays = [plan.rows[i] for i in missing]
    return queries.JOB_MATCH_REQUESTS, queries.many_params(
        replays, [plan.payloads[i] for i in missing]
    )


def _outcome(plan: _Plan, rows: Iterable[Row], replays: Iterable[Row] = ()) -> _Outcome:
    """Read JOB_SUBMIT_MANY's rows (id, idempotency_key, created) and JOB_MATCH_REQUESTS' (id,
    idempotency_key, same). A job without a key has the id it was given; only keyed ones
    may name a job that existed before."""
    by_key: dict[str, UUID] = {}
    created: list[Any] = []
    for row in rows:
        if row["idempotency_key"] is not None:
            by_key[row["idempotency_key"]] = _uuid(row["id"])
        created.append(row["id"])
    for row in replays:
        if row["same"]:
            by_key[row["idempotency_key"]] = _uuid(row["id"])
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


# --- enqueue ------------------------------------------------------------------------


def _run(runner: connections.Runner, plan: _Plan) -> list[UUID]:
    statement, params = _write(plan)
    with runner.atomic():
        rows = runner.fetch(statement, params)
        if statement is queries.JOB_SUBMIT_MANY_KEYLESS:
            runner.fetch(queries.JOB_NOTIFY, {})
            return [new.id for new in plan.jobs]
        replays = _replays(plan, rows)
        found = runner.fetch(*replays) if replays is not None else []
        outcome = _outcome(plan, rows, found)
        if outcome.conflict is not None:
            if outcome.created:
                runner.fetch(_UNDO, {"ids": outcome.created})
            raise IdempotencyConflict(outcome.conflict)
        if outcome.created:
            runner.fetch(queries.JOB_NOTIFY, {})
    return outcome.ids


async def _run_async(runner: connections.Runner, items: Sequence[Any]) -> list[UUID]:
    fetch: Callable[[Any, Mapping[str, Any]], Awaitable[Any]] = runner.fetch
    lookup = _lookup(items)
    plan = _plan(items, await fetch(*lookup) if lookup is not None else ())
    if not plan.rows:
        return []
    statement, params = _write(plan)
    async with runner.atomic():
        rows = await fetch(statement, params)
        if statement is queries.JOB_SUBMIT_MANY_KEYLESS:
            await fetch(queries.JOB_NOTIFY, {})
            return [new.id for new in plan.jobs]
        replays = _replays(plan, rows)
        found = await fetch(*replays) if replays is not None else []
        outcome = _outcome(plan, rows, found)
        if outcome.conflict is not None:
            if outcome.created:
                await fetch(_UNDO, {"ids": outcome.created})
            raise IdempotencyConflict(outcome.conflict)
        if outcome.created:
            await fetch(queries.JOB_NOTIFY, {})
    return outcome.ids


async def _first(ids: Awaitable[list[UUID]]) -> UUID:
    return (await ids)[0]


@overload
def enqueue_many(
    conn: SyncConnection, jobs: Iterable[Mapping[str, Any]], *, schema: str | None = None
) -> list[UUID]: ...


@overload
def enqueue_many(
    conn: AsyncConnectionLike, jobs: Iterable[Mapping[str, Any]], *, schema: str | None = None
) -> Coroutine[Any, Any, list[UUID]]: ...


def enqueue_many(conn: Any, jobs: Iterable[Mapping[str, Any]], *, schema: str | None = None) -> Any:
    """Write `jobs` (create items as the API's batch takes them: `type`, `payload`,
    `max_attempts`, `queue`, `priority`, `run_at` or `delay`, `timeout`, `concurrency_key`,
    `idempotency_key`)
    in the transaction open on `conn`, with one statement. Returns their ids in input order
    (a coroutine of them, for an async connection); an item whose idempotency key names an
    existing job of the same request gets that job's id.

    `schema` is the PostgreSQL schema holding jobqueue's tables: default the process's
    `DATABASE_SCHEMA` (`jobqueue` when unset). The statements name it; the connection's
    `search_path` does not matter.

    Raises `InvalidRequest` (a ValueError) naming every invalid item, and
    `IdempotencyConflict` when a key is bound to a different request; either way the
    transaction holds none of these jobs. A `schema` that cannot be one is a ValueError.
    """
    runner = connections.runner_for(conn, schema)
    items = list(jobs)
    if runner.is_async:
        return _run_async(runner, items)
    lookup = _lookup(items)
    plan = _plan(items, runner.fetch(*lookup) if lookup is not None else ())
    return _run(runner, plan) if plan.rows else []


@overload
def enqueue(
    conn: SyncConnection,
    type: str,
    payload: Any = None,
    *,
    schema: str | None = None,
    **fields: Any,
) -> UUID: ...


@overload
def enqueue(
    conn: AsyncConnectionLike,
    type: str,
    payload: Any = None,
    *,
    schema: str | None = None,
    **fields: Any,
) -> Coroutine[Any, Any, UUID]: ...


def enqueue(
    conn: Any, type: str, payload: Any = None, *, schema: str | None = None, **fields: Any
) -> Any:
    """Write one job of `type` in the transaction open on `conn`; returns its id (a coroutine
    of it, for an async connection). `payload` defaults to `{}`; `fields` are the create
    request's (`max_attempts`, `queue`, `priority`, `run_at` as an aware datetime or RFC 3339
    text, `delay` and `timeout` as seconds, a timedelta or a duration such as "90s",
    `concurrency_key`) and `idempotency_key`; `schema` as for `enqueue_many`. Raises as
    `enqueue_many` does."""
    ids = enqueue_many(conn, [_item(type, payload, fields)], schema=schema)
    if isinstance(ids, list):
        return ids[0]
    return _first(ids)
