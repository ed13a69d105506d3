"""Which PostgreSQL schema jobqueue's objects live in, and the one rewrite of SQL into it.

Every statement jobqueue sends names its tables with their schema (`jobqueue.jobs`),
never relying on the connection's `search_path`: a caller's connection in transactional
enqueue has the caller's, a pooled connection anyone's. The constructs of
`jobcore.queries` and every SQL text are written for `DEFAULT_SCHEMA`. A process whose
`DATABASE_SCHEMA` is another schema sends them through `translate`, in the places that
turn SQL into something sent: `jobcore.runner` (asyncpg, psycopg) and the engines of
`jobcore.db.make_engine` (whatever SQLAlchemy executes, constructs and text alike).

A process has one schema (`current()`): the services set it from their settings at start
(`use`); otherwise it is `DATABASE_SCHEMA` from the environment, else `DEFAULT_SCHEMA`.
`jobcore.enqueue(..., schema=...)` can name another for one call.
"""

from __future__ import annotations

import re
from functools import lru_cache

from jobcore import environ
from jobcore.errors import ConfigError

DEFAULT_SCHEMA = "jobqueue"
VARIABLE = "DATABASE_SCHEMA"
# A plain lower-case identifier: written into SQL without quoting, the same in every tool.
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
# `public` is where releases before the schema kept their tables (the migrations move them
# out of it and leave compatibility views there for one release); `pg_*` and
# `information_schema` are PostgreSQL's own.
_REFUSED = ("public", "information_schema")
# `jobqueue.` as a schema qualifier: not inside another identifier (`x_jobqueue.`), not a
# column of a table named jobqueue (`t.jobqueue.`), not a quoted identifier's tail.
_QUALIFIER = re.compile(r'(?<![\w.$"])' + DEFAULT_SCHEMA + r"\.(?=[a-z_])")

_current: str | None = None


def check(name: str) -> str:
    """`name` if it can be jobqueue's schema; else ValueError saying why."""
    if not _NAME.fullmatch(name):
        raise ValueError("must be a plain lower-case identifier matching ^[a-z_][a-z0-9_]{0,62}$")
    if name in _REFUSED or name.startswith("pg_"):
        raise ValueError("is reserved: choose a schema of jobqueue's own")
    return name


def from_environment() -> str:
    """`DATABASE_SCHEMA` from the environment, checked as the settings check it;
    `DEFAULT_SCHEMA` when unset or empty. Raises ConfigError naming the variable."""
    value = environ.getenv(VARIABLE)
    if not value:
        return DEFAULT_SCHEMA
    try:
        return check(value)
    except ValueError as exc:
        raise ConfigError(environ.variable(VARIABLE), str(exc)) from None


def current() -> str:
    """This process's schema: the one `use` set, else the environment's, else the default."""
    global _current
    if _current is None:
        _current = from_environment()
    return _current


def use(name: str) -> None:
    """Make `name` this process's schema (the services call it with their settings)."""
    global _current
    _current = check(name)


def translate(sql: str, schema: str | None = None) -> str:
    """`sql`, written for DEFAULT_SCHEMA, naming `schema` (default: `current()`) instead."""
    target = current() if schema is None else schema
    if target == DEFAULT_SCHEMA:
        return sql
    return _translate(sql, target)


@lru_cache(maxsize=4096)
def _translate(sql: str, schema: str) -> str:
    # Cached: the same few hundred statements are sent over and over.
    return _QUALIFIER.sub(schema + ".", sql)


def qualified(table: str, schema: str | None = None) -> str:
    """`schema.table`, as SQL (schema names need no quotes: `check` allows none that do)."""
    return f"{current() if schema is None else schema}.{table}"
