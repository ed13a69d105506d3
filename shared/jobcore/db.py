"""Database plumbing shared by both services: URLs, engines, session names, the
schema-at-head check.

`connect_args(url)` owns the translation of a libpq-style `DATABASE_URL` into
asyncpg's connect arguments, and `connect(**connect_args(url))` connects with them;
every connection (the engines of both services, migrations, the LISTEN connections)
is made through both, so a URL that works for one works for all. `check_url(url)` is
the same parse without the result: settings validation calls it so a URL that cannot
work stops the process at startup instead of failing every connection attempt later.

Every connection must reach the writable primary. The hosts of a multi-host URL are
tried in turn, each under the whole connect timeout (`connect`), and with
`target_session_attrs=read-write` (or `primary`) a standby is skipped. A connection
that reached a read-only server anyway (no `target_session_attrs`, or `any`) is
refused its first write with `read_only_sql_transaction`; `on_read_only_server` tells
that error apart so the connection is dropped, never reused: `make_engine`'s engines
treat it as a lost connection, and `probe_writable` is what readiness asks.

Sessions are named `<role>/<revision>` (`session_name`): `jobqueue migrate` tells this
release's sessions from the previous release's, whose names had no revision, by
`pg_stat_activity.application_name` (`jobcore.migrate`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import urllib.parse
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from jobcore import naming
from jobcore.errors import ReadOnlyServer, SchemaNotAtHead, describe
from jobcore.schema import ACCEPTED_REVISIONS, SCHEMA_REVISION

log = logging.getLogger("jobqueue")

_SCHEME = re.compile(r"postgres(?:ql)?(?:\+asyncpg)?://")

# libpq parameters asyncpg's own DSN parser understands with libpq's meaning: they stay
# in the DSN. Every other parameter is either translated below or refused, because
# asyncpg would send it to the server as a setting and the connection would fail.
_NATIVE = frozenset(
    {
        "host",
        "port",
        "dbname",
        "user",
        "password",
        "passfile",
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "sslcrl",
        "sslpassword",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "target_session_attrs",
    }
)
_TRANSLATED = frozenset({"connect_timeout", "application_name", "options"})
SUPPORTED_PARAMETERS = tuple(sorted(_NATIVE | _TRANSLATED))

_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "target_session_attrs": (
        "any",
        "primary",
        "standby",
        "prefer-standby",
        "read-write",
        "read-only",
    ),
    "ssl_min_protocol_version": ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"),
    "ssl_max_protocol_version": ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"),
}
_FILES = ("sslrootcert", "sslcert", "sslkey", "sslcrl", "passfile")
# libpq waits at least 2 s when connect_timeout is set; beyond an hour is a mistake.
_MIN_CONNECT_TIMEOUT = 2
MAX_CONNECT_TIMEOUT = 3600


@dataclass(frozen=True)
class _Parsed:
    dsn: str
    connect_timeout: float | None
    server_settings: Mapping[str, str]


def _parse(url: str) -> _Parsed:
    """Split `url` into what asyncpg parses itself and what is translated here.

    Raises ValueError naming the parameter at fault (never echoing a password).
    """
    scheme = _SCHEME.match(url)
    if scheme is None:
        raise ValueError("must start with postgres:// or postgresql://")
    base, _, query = url[scheme.end() :].partition("?")
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"malformed query string {query!r}") from None
    native: dict[str, str] = {}
    connect_timeout: float | None = None
    server_settings: dict[str, str] = {}
    for name, value in pairs:  # a repeated parameter: the last one counts, as in libpq
        if name not in _NATIVE and name not in _TRANSLATED:
            raise ValueError(
                f"parameter {name!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_PARAMETERS)})"
            )
        if value == "" and name != "password":
            raise ValueError(f"parameter {name!r} has an empty value")
        choices = _CHOICES.get(name)
        if choices is not None and value not in choices:
            raise ValueError(f"{name}={value!r} is not one of {', '.join(choices)}")
        if name == "sslrootcert" and value == "system":
            raise ValueError("sslrootcert=system is not supported: name a CA certificate file")
        if name in _FILES and not os.path.isfile(os.path.expanduser(value)):
            raise ValueError(f"{name}: no such file {value!r}")
        if name == "connect_timeout":
            connect_timeout = _connect_timeout(value)
        elif name in _TRANSLATED:
            server_settings[name] = value
        else:
            native[name] = value
    dsn = "postgresql://" + base
    if native:
        dsn += "?" + urllib.parse.urlencode(native, quote_via=urllib.parse.quote)
    return _Parsed(dsn, connect_timeout, server_settings)


def _connect_timeout(value: str) -> float | None:
    try:
        seconds = int(value)
    except ValueError:
        raise ValueError(f"connect_timeout={value!r} is not a whole number of seconds") from None
    if seconds > MAX_CONNECT_TIMEOUT:
        raise ValueError(f"connect_timeout={seconds} exceeds {MAX_CONNECT_TIMEOUT} seconds")
    # libpq: zero or less waits forever; a service never does, so it keeps its own bound.
    return float(max(seconds, _MIN_CONNECT_TIMEOUT)) if seconds > 0 else None


def session_name(role: str = "jobqueue") -> str:
    """This release's `application_name` for a session of `role` (`jobqueue-api`,
    `jobqueue-worker`, ...): the role and the revision this code migrates to. The URL's own
    `application_name` still wins."""
    return f"{role}/{SCHEMA_REVISION}"


def check_url(url: str) -> None:
    """Raise ValueError naming the parameter at fault if `url` cannot be used to connect."""
    _parse(url)


def connect_args(
    url: str,
    *,
    application_name: str | None = None,
    timeout: float = 5.0,
) -> dict[str, Any]:
    """Keyword arguments for `asyncpg.connect()` that connect as the libpq URL `url` says.

    `application_name` and `timeout` are the caller's defaults: the URL's
    `application_name` and `connect_timeout` win over them. The only startup parameters
    sent are `application_name` and the URL's own `options`: a pooler refuses others, and
    a setting of the services' own is the transaction's (`SET LOCAL`), never the
    session's, which a pooler in transaction mode shares with other clients.
    """
    parsed = _parse(url)
    settings = {"application_name": application_name or session_name(), **parsed.server_settings}
    return {
        "dsn": parsed.dsn,
        "timeout": parsed.connect_timeout if parsed.connect_timeout is not None else timeout,
        "server_settings": settings,
    }


# Failures of one host after which libpq, and asyncpg, try the next one.
_NEXT_HOST = (
    OSError,
    TimeoutError,
    asyncpg.CannotConnectNowError,
    asyncpg.TargetServerAttributeNotMatched,
)


async def connect(**kwargs: Any) -> asyncpg.Connection:
    """`asyncpg.connect(**kwargs)` (`connect_args`' keywords), with each host of a multi-host
    DSN given the whole `timeout`, as libpq gives `connect_timeout` to each host.

    asyncpg's timeout covers all the hosts together: a first host that drops every packet
    (the machine of a primary that failed) would use it up before the next one, the
    promoted standby, is tried, and every connection would time out. Here the hosts are
    tried one at a time, in order, each with `target_session_attrs` checked as asyncpg
    checks it. A host list given as `?host=` (or `prefer-standby`, which looks at all the
    hosts before it picks one) is left to asyncpg alone."""
    dsn = kwargs.get("dsn", "")
    hosts = _authority_hosts(dsn)
    if len(hosts) < 2:
        return await asyncpg.connect(**kwargs)
    userinfo, rest = hosts.pop(0), hosts.pop()
    failure: BaseException | None = None
    for n, host in enumerate(hosts, start=1):
        try:
            return await asyncpg.connect(**{**kwargs, "dsn": f"{userinfo}{host}{rest}"})
        except _NEXT_HOST as exc:
            # Which host failed, and why: what a failover's logs must say.
            log.warning(
                "database host skipped",
                extra={
                    "host": host,
                    "error": describe(exc),
                    "next_host": hosts[n] if n < len(hosts) else None,
                },
            )
            # As asyncpg reports it: a host that could not be reached over one that could,
            # but is a standby.
            if failure is None or not isinstance(exc, asyncpg.TargetServerAttributeNotMatched):
                failure = exc
    assert failure is not None
    raise failure


def _authority_hosts(dsn: str) -> list[str]:
    """`[scheme + userinfo, host1, host2, ..., path + query]` when `dsn`'s authority names
    several hosts and nothing else decides where to connect; else `[]`."""
    base, _, query = dsn.partition("?")
    params = urllib.parse.parse_qs(query)
    if {"host", "port"} & params.keys() or "prefer-standby" in params.get(
        "target_session_attrs", ()
    ):
        return []
    scheme, _, remainder = base.partition("://")
    authority, slash, path = remainder.partition("/")
    userinfo, at, hostlist = authority.rpartition("@")
    hosts = hostlist.split(",")
    if len(hosts) < 2:
        return []
    prefix = f"{scheme}://{userinfo}{at}"
    return [prefix, *hosts, f"{slash}{path}" + (f"?{query}" if query else "")]


def asyncpg_dsn(url: str) -> str:
    """The DSN part of `connect_args(url)`, for a plain `asyncpg.connect(dsn)` in tests."""
    return _parse(url).dsn


# SQLSTATE read_only_sql_transaction: a write, or a LISTEN, on a server that takes none.
READ_ONLY_SQLSTATE = "25006"


def on_read_only_server(exc: BaseException) -> bool:
    """Whether `exc` (asyncpg's error, or SQLAlchemy's wrapping it) is the server refusing a
    write because it is read-only: the connection is on the wrong server, not broken."""
    seen: BaseException | None = exc
    for _ in range(4):  # SQLAlchemy's error, its DBAPI adapter's, asyncpg's
        if seen is None:
            break
        if getattr(seen, "sqlstate", None) == READ_ONLY_SQLSTATE:
            return True
        seen = getattr(seen, "orig", None) or seen.__cause__
    return False


# Off on a standby (in recovery) and on a server set default_transaction_read_only.
_WRITABLE = sa.text("SELECT current_setting('transaction_read_only') = 'off'")


async def check_writable(conn: AsyncConnection) -> None:
    """Raise ReadOnlyServer, `conn` dropped from its pool, unless its server takes writes."""
    if not await conn.scalar(_WRITABLE):
        await conn.invalidate()
        raise ReadOnlyServer()


# One readiness check per engine at a time, left to finish when the probes waiting on it
# gave up (`probe_writable`).
_probes: weakref.WeakKeyDictionary[Any, asyncio.Task[None]] = weakref.WeakKeyDictionary()


async def probe_writable(engine: AsyncEngine) -> None:
    """Return if a connection of `engine` is on a server that takes writes; else raise
    ReadOnlyServer or the connection's error. What readiness asks, under its own timeout.

    The check is not cut short when the probe gives up (is cancelled): a connect still
    trying the next host of the URL (each host gets the whole connect timeout, longer than
    a probe waits, and a failed primary that drops every packet uses all of it) goes on,
    and its connection, pooled, lets the next probe answer at once. Probes at the same
    time share one check."""
    task = _probes.get(engine.sync_engine)
    if task is None or task.done():
        task = asyncio.ensure_future(_check_engine(engine))
        # Its error is the probes' to report; one that no probe waited for is not lost.
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        _probes[engine.sync_engine] = task
    await asyncio.shield(task)


async def _check_engine(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        await check_writable(conn)


def make_engine(
    url: str,
    *,
    pool_size: int = 5,
    connect_timeout: float = 5.0,
    pre_ping: bool = True,
    schema: str | None = None,
    **kwargs: Any,
) -> AsyncEngine:
    """An asyncpg engine that fails fast when the database is unreachable.

    `pre_ping` costs a round trip per checkout; a caller that retries failed
    statements anyway (the worker) turns it off. `schema` (default: the process's,
    `jobcore.naming.current()`) is where its statements find jobqueue's tables: for any
    schema but the default, every statement it sends is rewritten into it.
    """
    args = connect_args(
        url,
        application_name=kwargs.pop("application_name", None),
        timeout=connect_timeout,
    )
    # The whole URL travels in `dsn` (multi-host lists and `?host=/socket/dir` included),
    # parsed by asyncpg: SQLAlchemy's URL parser would turn each query parameter into a
    # keyword argument asyncpg.connect() does not take.
    # SQLAlchemy's asyncpg dialect connects with `async_creator_fn` when it is given one.
    args["async_creator_fn"] = connect
    engine = create_async_engine(
        "postgresql+asyncpg://",
        pool_size=pool_size,
        max_overflow=kwargs.pop("max_overflow", 0),
        pool_timeout=kwargs.pop("pool_timeout", connect_timeout),
        pool_pre_ping=pre_ping,
        connect_args=args,
        **kwargs,
    )

    @event.listens_for(engine.sync_engine, "handle_error")
    def _read_only(context: Any) -> None:
        # Handled as a lost connection: this one is invalidated, and the pool's others
        # (likely on the same server) are replaced at their next checkout; the caller gets
        # a DBAPIError with connection_invalidated set.
        if on_read_only_server(context.original_exception):
            context.is_disconnect = True

    target = naming.current() if schema is None else naming.check(schema)
    if target != naming.DEFAULT_SCHEMA:
        # Constructs and text alike, whatever SQLAlchemy executes: the one rewrite.
        @event.listens_for(engine.sync_engine, "before_cursor_execute", retval=True)
        def _into_schema(
            conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
        ) -> tuple[str, Any]:
            return naming.translate(statement, target), parameters

    return engine


# The version table, in jobqueue's schema; rewritten by the engine like every statement.
_VERSION_EXISTS = sa.text("SELECT to_regclass('jobqueue.alembic_version') IS NOT NULL")
_VERSION = sa.text("SELECT version_num FROM jobqueue.alembic_version")


async def schema_revision(conn: AsyncConnection) -> str | None:
    """The revision recorded in jobqueue's schema, or None (nothing migrated there yet)."""
    if not await conn.scalar(_VERSION_EXISTS):
        return None
    found = await conn.scalar(_VERSION)
    return str(found) if found is not None else None


async def check_schema(engine: AsyncEngine) -> None:
    """Raise SchemaNotAtHead unless migrations have brought the schema to a revision this
    code works on (`ACCEPTED_REVISIONS`)."""
    async with engine.connect() as conn:
        found = await schema_revision(conn)
    if found not in ACCEPTED_REVISIONS:
        raise SchemaNotAtHead(found, SCHEMA_REVISION)
