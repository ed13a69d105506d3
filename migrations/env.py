"""Alembic environment: migrates the database named by DATABASE_URL.

Takes an advisory lock for the whole run, so several `alembic upgrade head`
started together apply each revision once, then runs the migrations in one
transaction; a revision that must work outside a transaction (`CREATE INDEX
CONCURRENTLY` on a table that may be large) commits what came before and
continues in autocommit, still under the lock (it is held by the session).
"""

from __future__ import annotations

import asyncio
import time
from logging.config import fileConfig

import sqlalchemy as sa
from alembic import context
from alembic.util import CommandError
from sqlalchemy.engine import Connection

from jobcore.db import check_url, make_engine
from jobcore.environ import getenv, variable
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
    context.configure(connection=connection, target_metadata=target_metadata)
    _lock(connection)
    try:
        with context.begin_transaction():
            context.run_migrations()
    finally:
        connection.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
        connection.commit()


async def run_online() -> None:
    engine = make_engine(database_url(), pool_size=1, application_name="jobqueue-migrate")
    try:
        async with engine.connect() as conn:
            await conn.run_sync(migrate)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    database_url()  # checked, though offline mode only writes SQL
    context.configure(
        dialect_name="postgresql", target_metadata=target_metadata, literal_binds=True
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(run_online())
