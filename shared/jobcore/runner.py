"""The one compile cache and the one way a statement is sent: a construct of
`jobcore.queries` compiled once per process and dialect (`of`), its parameters put in the
order the SQL takes them (`Compiled.args`), on a connection kind's adapter (`Driver` for
asyncpg, which the worker and the API's hot path use; `jobcore.connections` for every kind
transactional enqueue takes).

The SQL is compiled for jobqueue's default schema and sent in the process's own
(`jobcore.naming`): `Compiled.sql` is the statement as this process sends it,
`Compiled.sql_in(schema)` as a caller naming another schema does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect

from jobcore import naming

_DIALECT = asyncpg_dialect()  # type: ignore[no-untyped-call]


class Driver(Protocol):
    """The part of an asyncpg connection these calls use."""

    async def fetch(self, query: str, *args: Any) -> list[Any]: ...

    def is_closed(self) -> bool: ...

    def is_in_transaction(self) -> bool: ...

    def transaction(self) -> Any: ...


class Compiled:
    """A construct's SQL for asyncpg, and how to order its parameters."""

    __slots__ = ("_order", "_sql", "_translated")

    def __init__(self, statement: Any) -> None:
        compiled = statement.compile(dialect=_DIALECT)
        self._sql: str = compiled.string
        # The last schema asked for and the SQL in it (a process asks for one schema).
        self._translated: tuple[str, str] = (naming.DEFAULT_SCHEMA, self._sql)
        binds = compiled.binds
        # Per positional parameter: the caller's value by name (fixed=None), or the
        # literal the construct itself holds (e.g. `attempts + 1`).
        self._order: list[tuple[str, bool, Any]] = [
            (name, binds[name].required, binds[name].effective_value)
            for name in compiled.positiontup or ()
        ]

    @property
    def sql(self) -> str:
        """The statement in this process's schema (`jobcore.naming.current()`)."""
        return self.sql_in(naming.current())

    def sql_in(self, schema: str) -> str:
        """The statement naming `schema`'s tables."""
        target, sql = self._translated
        if target != schema:
            sql = naming.translate(self._sql, schema)
            self._translated = (schema, sql)
        return sql

    @property
    def positional(self) -> list[str]:
        """What each `$n` stands for, in order: a caller's parameter, or a literal the
        construct holds itself (shown as `=value`)."""
        return [name if required else f"{name}={fixed!r}" for name, required, fixed in self._order]

    @property
    def parameters(self) -> set[str]:
        """The names the caller supplies."""
        return {name for name, required, _ in self._order if required}

    def args(self, values: Mapping[str, Any]) -> list[Any]:
        return [values[name] if required else fixed for name, required, fixed in self._order]


_CACHE: dict[tuple[str, int], Any] = {}


def of(statement: Any, dialect: str = "asyncpg") -> Any:
    """`statement` compiled once per process: for asyncpg a `Compiled`; for "psycopg" the
    SQLAlchemy compilation, whose `string` and `construct_params` the caller uses."""
    key = (dialect, id(statement))
    found = _CACHE.get(key)
    if found is None:
        if dialect == "asyncpg":
            found = Compiled(statement)
        else:
            from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect

            found = statement.compile(dialect=psycopg_dialect())  # type: ignore[no-untyped-call]
        _CACHE[key] = (statement, found)  # the construct too: its id must stay its own
        return found
    return found[1]
