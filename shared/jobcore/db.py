"""Database plumbing shared by both services: URLs, engines, the schema-at-head check."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from jobcore.errors import SchemaNotAtHead
from jobcore.schema import SCHEMA_REVISION


def async_url(url: str) -> str:
    """The SQLAlchemy asyncpg URL for a libpq-style `postgres://` or `postgresql://` URL."""
    parsed = make_url(url.replace("postgres://", "postgresql://", 1))
    return parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


def asyncpg_dsn(url: str) -> str:
    """The plain `postgresql://` DSN asyncpg.connect() takes, for connections outside a pool."""
    parsed = make_url(url.replace("postgres://", "postgresql://", 1))
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def make_engine(
    url: str,
    *,
    pool_size: int = 5,
    connect_timeout: float = 5.0,
    statement_timeout: float | None = None,
    pre_ping: bool = True,
    **kwargs: Any,
) -> AsyncEngine:
    """An asyncpg engine that fails fast when the database is unreachable.

    `pre_ping` costs a round trip per checkout; a caller that retries failed
    statements anyway (the worker) turns it off.
    """
    server_settings = {"application_name": kwargs.pop("application_name", "jobqueue")}
    if statement_timeout is not None:
        server_settings["statement_timeout"] = str(int(statement_timeout * 1000))
    return create_async_engine(
        async_url(url),
        pool_size=pool_size,
        max_overflow=kwargs.pop("max_overflow", 0),
        pool_timeout=kwargs.pop("pool_timeout", connect_timeout),
        pool_pre_ping=pre_ping,
        connect_args={"timeout": connect_timeout, "server_settings": server_settings},
        **kwargs,
    )


async def schema_revision(conn: AsyncConnection) -> str | None:
    exists = await conn.scalar(sa.text("SELECT to_regclass('alembic_version') IS NOT NULL"))
    if not exists:
        return None
    found = await conn.scalar(sa.text("SELECT version_num FROM alembic_version"))
    return str(found) if found is not None else None


async def check_schema(engine: AsyncEngine) -> None:
    """Raise SchemaNotAtHead unless migrations have brought the schema to this code's revision."""
    async with engine.connect() as conn:
        found = await schema_revision(conn)
    if found != SCHEMA_REVISION:
        raise SchemaNotAtHead(found, SCHEMA_REVISION)
