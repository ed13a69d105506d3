"""Running jobcore's statements on a caller's own connection, whatever its kind: one adapter
per kind (SQLAlchemy `Connection` and `AsyncConnection`, an asyncpg connection or pool
connection, psycopg `Connection` and `AsyncConnection`, Django's connection on psycopg),
each sending a construct's SQL as compiled once by `jobcore.runner.of` and returning rows
by column name. Recognised by the connection class's package, so psycopg, asyncpg and
Django are imported only by callers that pass their connections (`jobcore.transactional`).

Each adapter sends the statements naming its `schema`'s tables (`jobcore.naming`): the
SQL that `runner.of` compiled, rewritten by `naming.translate`, or, on SQLAlchemy, which
compiles the construct itself, SQLAlchemy's `schema_translate_map`. The caller's
`search_path` plays no part."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager, nullcontext
from typing import Any

from jobcore import naming, runner


class Runner:
    """Runs jobcore's statements on one kind of connection: `fetch` returns the rows, their
    columns by name; `atomic` makes the statements one transaction when none is open."""

    is_async = False
    # Each kind's own: a plain function for the sync kinds, a coroutine function otherwise.
    fetch: Callable[[Any, Mapping[str, Any]], Any]

    def __init__(self, conn: Any, schema: str = naming.DEFAULT_SCHEMA) -> None:
        self.conn = conn
        self.schema = schema

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


def _sqlalchemy_options(schema: str) -> dict[str, Any]:
    """SQLAlchemy's own rewrite of the constructs' schema (they are all constructs, no text)."""
    if schema == naming.DEFAULT_SCHEMA:
        return {}
    return {"schema_translate_map": {naming.DEFAULT_SCHEMA: schema}}


class _SqlAlchemy(Runner):
    def __init__(self, conn: Any, schema: str = naming.DEFAULT_SCHEMA) -> None:
        _refuse_autocommit(conn)
        super().__init__(conn, schema)
        self._options = _sqlalchemy_options(schema)

    def fetch(self, statement: Any, values: Mapping[str, Any]) -> list[Any]:
        result = self.conn.execute(statement, values, execution_options=self._options)
        return list(result.mappings()) if result.returns_rows else []


class _SqlAlchemyAsync(Runner):
    is_async = True

    def __init__(self, conn: Any, schema: str = naming.DEFAULT_SCHEMA) -> None:
        _refuse_autocommit(conn.sync_connection)
        super().__init__(conn, schema)
        self._options = _sqlalchemy_options(schema)

    async def fetch(self, statement: Any, values: Mapping[str, Any]) -> list[Any]:
        result = await self.conn.execute(statement, values, execution_options=self._options)
        return list(result.mappings()) if result.returns_rows else []


class _Asyncpg(Runner):
    is_async = True

    async def fetch(self, statement: Any, values: Mapping[str, Any]) -> list[Any]:
        compiled = runner.of(statement)
        return list(await self.conn.fetch(compiled.sql_in(self.schema), *compiled.args(values)))

    def atomic(self) -> AbstractAsyncContextManager[Any]:
        if self.conn.is_in_transaction():
            return nullcontext()
        transaction: AbstractAsyncContextManager[Any] = self.conn.transaction()
        return transaction


def _for_psycopg(
    statement: Any, values: Mapping[str, Any], schema: str
) -> tuple[str, dict[str, Any]]:
    compiled = runner.of(statement, "psycopg")
    sql = naming.translate(compiled.string, schema)
    return sql, dict(compiled.construct_params(values))


def _psycopg_idle(conn: Any) -> bool:
    """Autocommit and no transaction block open: each statement would commit on its own."""
    from psycopg.pq import TransactionStatus

    idle: bool = conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
    return idle


class _Psycopg(Runner):
    def fetch(self, statement: Any, values: Mapping[str, Any]) -> list[Any]:
        from psycopg.rows import dict_row

        sql, params = _for_psycopg(statement, values, self.schema)
        with self.conn.cursor(row_factory=dict_row) as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description is not None else []

    def atomic(self) -> AbstractContextManager[Any]:
        if _psycopg_idle(self.conn):
            transaction: AbstractContextManager[Any] = self.conn.transaction()
            return transaction
        return nullcontext()


class _PsycopgAsync(Runner):
    is_async = True

    async def fetch(self, statement: Any, values: Mapping[str, Any]) -> list[Any]:
        from psycopg.rows import dict_row

        sql, params = _for_psycopg(statement, values, self.schema)
        async with self.conn.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(sql, params)
            return list(await cursor.fetchall()) if cursor.description is not None else []

    def atomic(self) -> AbstractAsyncContextManager[Any]:
        if _psycopg_idle(self.conn):
            transaction: AbstractAsyncContextManager[Any] = self.conn.transaction()
            return transaction
        return nullcontext()


def _django(conn: Any, schema: str) -> Runner:
    """Django's connection (`django.db.connection`, or `connections[alias]`) on PostgreSQL
    through psycopg 3: the statements run on the psycopg connection under it, so inside
    `transaction.atomic()` they are in that transaction (Django has turned autocommit off),
    and outside one in a transaction of their own, as on any autocommitting connection."""
    if getattr(conn, "vendor", None) != "postgresql":
        raise TypeError(
            f"cannot enqueue on Django's {getattr(conn, 'vendor', '?')} database: "
            "jobqueue's tables are in PostgreSQL"
        )
    conn.ensure_connection()
    inner = conn.connection
    if type(inner).__module__.partition(".")[0] != "psycopg":
        raise TypeError(
            "cannot enqueue on a Django connection through psycopg2: install psycopg 3, "
            "which Django uses when it is present"
        )
    return _Psycopg(inner, schema)


# (package, class name) of a connection class or one of its bases -> how to run on it.
ADAPTERS: dict[tuple[str, str], Callable[[Any, str], Runner]] = {
    ("sqlalchemy", "Connection"): _SqlAlchemy,
    ("sqlalchemy", "AsyncConnection"): _SqlAlchemyAsync,
    ("asyncpg", "Connection"): _Asyncpg,
    ("asyncpg", "_ConnectionProxy"): _Asyncpg,  # a pool's connection
    ("psycopg", "Connection"): _Psycopg,
    ("psycopg", "AsyncConnection"): _PsycopgAsync,
    # `django.db.connection` is a proxy of the default alias's wrapper.
    ("django", "ConnectionProxy"): _django,
    ("django", "BaseDatabaseWrapper"): _django,
}


def runner_for(conn: Any, schema: str | None = None) -> Runner:
    """The adapter for `conn`'s kind, by its class's package and name, sending statements
    into `schema` (default: the process's, `jobcore.naming.current()`)."""
    target = naming.current() if schema is None else naming.check(schema)
    for cls in type(conn).__mro__:
        make = ADAPTERS.get((cls.__module__.partition(".")[0], cls.__qualname__))
        if make is not None:
            return make(conn, target)
    raise TypeError(
        f"cannot enqueue on a {type(conn).__module__}.{type(conn).__qualname__}: pass a "
        "SQLAlchemy Connection or AsyncConnection (for a Session: session.connection()), an "
        "asyncpg connection, a psycopg Connection or AsyncConnection, or Django's connection"
    )
