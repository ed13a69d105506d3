"""Alembic environment: migrates the database named by DATABASE_URL into jobqueue's schema.

Every object of jobqueue's lives in one PostgreSQL schema, `DATABASE_SCHEMA` (default
`jobqueue`; `jobcore.naming`), Alembic's version table included
(`<schema>.alembic_version`), so an application's own Alembic project in the same database
(`public.alembic_version`, its own tables in `public`) never meets it.

A run takes an advisory lock for its whole length, so several runs started together apply
each revision once; then it creates the schema if missing, adopts a deployment of a release
that kept everything in `public` (`jobcore.migrate.adopt`: its revision moves from
`public.alembic_version` into the schema's), and runs the migrations in one transaction; a
revision that must work outside a transaction (`CREATE INDEX CONCURRENTLY` on a table that
may be large) commits what came before and continues in autocommit, still under the lock
(it is held by the session).

Revisions 0001-0007 name their objects unqualified: the session's `search_path` is the
schema alone, so on a new database they create everything there (an application's own
`public.jobs` is not seen); on an adopted deployment whose tables are still in `public`
(before 0008 moved them) it is `public`, where those revisions always ran. 0008 and later
name schemas explicitly.
"""

from __future__ import annotations

import asyncio
import time
from logging.config import fileConfig

import sqlalchemy as sa
from alembic import context
from alembic.util import CommandError
from sqlalchemy.engine import Connection

from jobcore import migrate as jobqueue_migrate
from jobcore import naming
from jobcore.db import check_url, make_engine, session_name
from jobcore.environ import getenv, variable
from jobcore.errors import ConfigError
from jobcore.schema import metadata

# Any constant shared by all migrators; "jobqueue" spelled in hex.
MIGRATION_LOCK = 0x6A6F6271756575
LOCK_POLL = 0.2

config = context.config
if config.config_file_name is not None and not config.attributes.get("skip_logging"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = metadata


def database_url() -> str:
    """The URL to migrate, checked as the services check it: a bad one is one clear line
    (alembic prints a CommandError as `FAILED: ...`, without a traceback)."""
    url: str = config.attributes.get("database_url") or getenv(
        "DATABASE_URL", "postgresql://localhost:5432/jobqueue"
    )
    try:
        check_url(url)
    except ValueError as exc:
        raise CommandError(f"invalid configuration: {variable('DATABASE_URL')}: {exc}") from None
    return url


def schema() -> str:
    """The schema to migrate: the caller's (`jobcore.migrate`), else DATABASE_SCHEMA."""
    given = config.attributes.get("schema")
    try:
        return naming.check(given) if given else naming.from_environment()
    except ValueError as exc:
        raise CommandError(f"invalid configuration: DATABASE_SCHEMA: {exc}") from None
    except ConfigError as exc:
        raise CommandError(f"invalid configuration: {exc}") from None


def _lock(connection: Connection) -> None:
    """Take the migration lock, polling: a session waiting in pg_advisory_lock() holds a
    snapshot, which a CREATE INDEX CONCURRENTLY of the lock's holder would wait for (a
    deadlock); short tries in between pauses hold none."""
    while True:
        taken = connection.scalar(
            sa.text("SELECT pg_try_advisory_lock(:key)"), {"key": MIGRATION_LOCK}
        )
        connection.commit()
        if taken:
            return
        time.sleep(LOCK_POLL)


def migrate(connection: Connection) -> None:
    target = schema()
    _lock(connection)
    try:
        # Under the lock: what a concurrent run did is seen, and done once.
        search_path = jobqueue_migrate.prepare(connection, target, _revisions())
        connection.execute(sa.text(f"SET search_path TO {search_path}"))  # for the session
        connection.commit()
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            version_table_schema=target,
        )
        with context.begin_transaction():
            context.run_migrations()
    finally:
        connection.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
        connection.commit()


def _revisions() -> frozenset[str]:
    """Every revision of jobqueue's: what `adopt` recognises in `public.alembic_version`."""
    from alembic.script import ScriptDirectory

    return frozenset(s.revision for s in ScriptDirectory.from_config(config).walk_revisions())


async def run_online() -> None:
    engine = make_engine(
        database_url(),
        pool_size=1,
        application_name=session_name("jobqueue-migrate"),
        # The revisions' SQL is sent as written: unqualified (0001-0007, by search_path) or
        # naming the schema it was given (0008 and later).
        schema=naming.DEFAULT_SCHEMA,
    )
    try:
        async with engine.connect() as conn:
            await conn.run_sync(migrate)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    database_url()  # checked, though offline mode only writes SQL
    target = schema()
    context.configure(
        dialect_name="postgresql",
        target_metadata=target_metadata,
        literal_binds=True,
        version_table_schema=target,
    )
    # Offline SQL is for a database whose version table is in the schema already (new, or
    # migrated by this release): the tables are there too.
    context.get_context().impl.static_output(f"CREATE SCHEMA IF NOT EXISTS {target};")
    context.get_context().impl.static_output(f"SET search_path TO {target};")
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(run_online())
