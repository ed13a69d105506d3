"""Per-test PostgreSQL databases, cloned from a migrated template.

The template is built once per schema version (its name hashes the migrations),
under an advisory lock so parallel test workers build it once. Each test then
gets `CREATE DATABASE ... TEMPLATE`, which takes tens of milliseconds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import make_url

from jobcore import compiled, history
from jobcore.schema import jobs

ROOT = Path(__file__).resolve().parent.parent
_LOCK = 0x6A7174657374  # any constant shared by test workers


def _devdb():
    spec = importlib.util.spec_from_file_location("devdb", ROOT / "scripts" / "devdb.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def server_url() -> str:
    """URL of the maintenance database of the server tests run on."""
    import os

    return os.environ.get("TEST_DATABASE_URL") or _devdb().server_template().format(db="postgres")


def with_database(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def _admin(url: str) -> psycopg.Connection:
    u = make_url(url)
    kwargs = {
        "host": u.query.get("host") or u.host or "127.0.0.1",
        "port": u.port or 5432,
        "dbname": u.database or "postgres",
        "autocommit": True,
    }
    if u.username:
        kwargs["user"] = u.username
    if u.password:
        kwargs["password"] = u.password
    return psycopg.connect(**kwargs)


def alembic_config(url: str) -> Config:
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "migrations"))
    config.attributes["database_url"] = url
    config.attributes["skip_logging"] = True
    return config


# Besides the revisions and env.py, what decides what a migration run creates: where it
# puts things (naming) and what it does before the revisions (migrate).
_MIGRATION_CODE = ("shared/jobcore/naming.py", "shared/jobcore/migrate.py", "alembic.ini")


def migrations_hash() -> str:
    digest = hashlib.sha256()
    paths = sorted((ROOT / "migrations").rglob("*.py")) + [ROOT / p for p in _MIGRATION_CODE]
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def ensure_template(server: str) -> str:
    name = f"jq_tpl_{migrations_hash()}"
    with _admin(server) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK,))
        try:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if not exists:
                building = f"{name}_build"
                conn.execute(f'DROP DATABASE IF EXISTS "{building}"')
                conn.execute(f'CREATE DATABASE "{building}"')
                command.upgrade(alembic_config(with_database(server, building)), "head")
                conn.execute(f'ALTER DATABASE "{building}" RENAME TO "{name}"')
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK,))
    return name


def create_database(server: str, template: str | None) -> str:
    name = f"jq_t_{uuid.uuid4().hex[:12]}"
    with _admin(server) as conn:
        clause = f' TEMPLATE "{template}"' if template else ""
        conn.execute(f'CREATE DATABASE "{name}"{clause}')
    return name


def drop_database(server: str, name: str) -> None:
    with _admin(server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def driver(conn: Any) -> Any:
    """The asyncpg connection under a SQLAlchemy `AsyncConnection`: what `jobcore.compiled`'s
    calls run on, in the worker and in the tests alike."""
    return (await conn.get_raw_connection()).driver_connection


async def entries_read(engine: Any, index: str, run: Callable[[Any], Awaitable[Any]]) -> int:
    """Entries of `index` (schema-qualified) that `run(conn)` reads on an asyncpg connection,
    dead ones included (each one a scan returns, whether its row turns out visible or
    not), counted for its transaction, which is rolled back."""
    count = f"SELECT pg_stat_get_xact_tuples_returned('{index}'::regclass)"
    async with engine.connect() as conn:
        raw = await driver(conn)
        transaction = raw.transaction()
        await transaction.start()
        # The backend's counts not yet reported include earlier transactions' reads;
        # inside one transaction none are reported, so the difference is `run`'s.
        before = await raw.fetchval(count)
        await run(raw)
        read = await raw.fetchval(count) - before
        await transaction.rollback()
    return int(read)


async def explain(
    conn: Any, sql: str, args: list[Any], *, generic: bool, analyze: bool = False
) -> Any:
    """The JSON plan of `sql` (asyncpg's text, `$n` parameters) with `args`, as the worker's
    prepared statements get it: a custom plan, or the generic one PostgreSQL caches after
    five executions. (A plain EXPLAIN of a parameterised statement always plans with the
    values, whatever `plan_cache_mode` says.) `conn` is an asyncpg connection; `analyze`
    runs the statement, which the caller rolls back."""
    prepared = await conn.prepare(sql)
    literals = []
    for arg, param in zip(args, prepared.get_parameters(), strict=True):
        sql_type = await conn.fetchval("SELECT format_type($1::oid, NULL)", param.oid)
        quoted = await conn.fetchval(f"SELECT quote_nullable(CAST($1 AS {sql_type}))", arg)
        literals.append(f"CAST({quoted} AS {sql_type})")
    name = f"explained_{uuid.uuid4().hex}"
    mode = "force_generic_plan" if generic else "force_custom_plan"
    await conn.execute(f"PREPARE {name} AS {sql}")
    try:
        await conn.execute(f"SET plan_cache_mode = {mode}")
        options = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
        execute = f"EXECUTE {name}" + (f"({', '.join(literals)})" if literals else "")
        return await conn.fetchval(f"EXPLAIN ({options}) {execute}")
    finally:
        await conn.execute("RESET plan_cache_mode")
        await conn.execute(f"DEALLOCATE {name}")


_JOB_COLUMNS = ", ".join(jobs.c.keys())


async def move(engine, ids: list[uuid.UUID]) -> None:
    """Move completed jobs to `jobs_history` as the move does: deleted from `jobs` and
    inserted there in one statement, every column named; their leaves added first."""
    async with engine.connect() as conn:
        d = await driver(conn)
        finished = await d.fetch("SELECT finished_at FROM jobqueue.jobs WHERE id = ANY($1)", ids)
        for row in finished:
            leaves = await compiled.history_leaves(d)
            leaf = history.leaf_at(row["finished_at"], history.HOUR, leaves)
            if leaf not in leaves:
                assert await compiled.history_add_leaf(d, leaf)
        await d.fetch(
            f"""WITH moved AS (DELETE FROM jobqueue.jobs WHERE id = ANY($1)
                               RETURNING {_JOB_COLUMNS})
                INSERT INTO jobqueue.jobs_history ({_JOB_COLUMNS})
                SELECT {_JOB_COLUMNS} FROM moved""",
            ids,
        )
