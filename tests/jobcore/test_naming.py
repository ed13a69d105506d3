"""Every statement names jobqueue's schema (jobcore.naming, docs/operations.md#migrations):
the hot paths work whatever the connection's `search_path` says, even when it finds another
`jobs` first, and in a schema other than the default when DATABASE_SCHEMA names one."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import compiled, history, migrate, naming, search, store
from jobcore.db import make_engine
from jobcore.errors import ConfigError
from jobcore.ids import new_id
from jobcore.registry import handler
from jobcore.rows import NewJob
from jobcore.states import Operation, Status
from jobcore.transactional import enqueue
from tests import pg


@handler("naming_test")
async def _naming_test(payload: Any, ctx: Any) -> None:
    return None


def test_the_schema_is_a_plain_lowercase_identifier():
    assert naming.check("jobqueue_2") == "jobqueue_2"
    for bad in ("Jobqueue", "1queue", "job-queue", "a" * 64, "", "public", "pg_jobs"):
        with pytest.raises(ValueError):
            naming.check(bad)


def test_a_bad_database_schema_is_a_config_error_naming_it(monkeypatch):
    monkeypatch.setenv("DATABASE_SCHEMA", "Jobs")
    with pytest.raises(ConfigError) as raised:
        naming.from_environment()
    assert raised.value.variable == "DATABASE_SCHEMA"


def test_translation_rewrites_the_qualifier_only():
    sql = (
        "SELECT jobqueue.jobs.id, x_jobqueue.t, 'jobqueue_cancel' FROM jobqueue.jobs"
        " JOIN jobqueue.job_types ON true WHERE to_regclass('jobqueue.jobs') IS NOT NULL"
    )
    assert naming.translate(sql, "queueing") == (
        "SELECT queueing.jobs.id, x_jobqueue.t, 'jobqueue_cancel' FROM queueing.jobs"
        " JOIN queueing.job_types ON true WHERE to_regclass('queueing.jobs') IS NOT NULL"
    )
    assert naming.translate(sql, naming.DEFAULT_SCHEMA) is sql


def _with_search_path(url: str, search_path: str) -> str:
    return url + ("&" if "?" in url else "?") + f"options=-csearch_path%3D{search_path}"


async def _hot_paths(engine: AsyncEngine, url: str, schema: str | None) -> list[Any]:
    """submit, enqueue on a caller's connection, claim, complete, get and list; the jobs."""
    async with engine.connect() as conn:
        submitted, created = await store.submit(
            conn, NewJob(new_id(), "naming_test", {"n": 1}, 3, idempotency_key="k1")
        )
        await conn.commit()
    assert created
    # The caller's own connection (psycopg), with the caller's search_path.
    with psycopg.connect(url) as caller:
        enqueued = enqueue(caller, "naming_test", {"n": 2}, schema=schema)
    async with engine.connect() as conn:
        driver = await pg.driver(conn)
        claimed = await compiled.claim(driver, {"default": 5}, 30.0)
        assert {c.id for c in claimed} == {submitted.id, enqueued}
        lost = await compiled.record(
            driver, Operation.COMPLETE, [c.lease for c in claimed], results=["1", None]
        )
        assert lost == []
        got = await store.get(conn, submitted.id)
        assert got is not None and got.status is Status.COMPLETED
        found, _ = await search.list_jobs(conn, search.Filters({Status.COMPLETED}), 10, None)
        await conn.commit()
    assert {job.id for job in found} == {submitted.id, enqueued}
    return found


@pytest.fixture
def decoy_url(database_url: str) -> str:
    """The test's database with a schema `decoy` holding a `jobs` of its own."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA decoy")
        conn.execute("CREATE TABLE decoy.jobs (id uuid PRIMARY KEY, note text)")
        conn.execute("CREATE TABLE decoy.alembic_version (version_num text)")
    return database_url


async def test_the_hot_paths_ignore_the_connections_search_path(decoy_url):
    url = _with_search_path(decoy_url, "decoy")
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            assert await conn.scalar(sa.text("SHOW search_path")) == "decoy"
        await _hot_paths(engine, url, None)
    finally:
        await engine.dispose()
    with psycopg.connect(decoy_url) as conn:
        assert conn.execute("SELECT count(*) FROM decoy.jobs").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM jobqueue.jobs").fetchone() == (2,)


@pytest.fixture
def other_schema(empty_database_url: str) -> Iterator[str]:
    """The test's database migrated into schema `queueing`, this process's schema meanwhile."""
    migrate.upgrade(empty_database_url, schema="queueing")
    naming.use("queueing")
    try:
        yield empty_database_url
    finally:
        naming.use(naming.DEFAULT_SCHEMA)


@pytest.fixture
async def other_engine(other_schema: str) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(other_schema)
    try:
        yield engine
    finally:
        await engine.dispose()


async def test_the_hot_paths_run_in_the_schema_database_schema_names(other_schema, other_engine):
    await _hot_paths(other_engine, other_schema, None)
    with psycopg.connect(other_schema) as conn:
        assert conn.execute("SELECT count(*) FROM queueing.jobs").fetchone() == (2,)
        schemas = {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}
    assert "jobqueue" not in schemas
    # The worker's table reads and its maintenance name the same schema.
    async with other_engine.connect() as conn:
        stats = await compiled.table_stats(await pg.driver(conn))
    assert {s.name for s in stats} == {
        "queueing.jobs",
        "queueing.jobs_history",
        "queueing.job_rate_windows",
        "queueing.maintenance_leases",
        "queueing.job_types",
        "queueing.queue_pauses",
    }
    # The history's leaves are made, listed and dropped there too.
    leaf = history.leaf_at(datetime.now(UTC) - timedelta(hours=3), history.HOUR, [])
    async with other_engine.connect() as conn:
        d = await pg.driver(conn)
        assert await compiled.history_add_leaf(d, leaf)
        assert await compiled.history_leaves(d) == [leaf]
        where = await d.fetch("SELECT schemaname FROM pg_tables WHERE tablename = $1", leaf.name)
        assert [row["schemaname"] for row in where] == ["queueing"]
        assert await compiled.history_drop_expired(d, 3600.0) == 0
        assert await compiled.history_leaves(d) == []


async def test_enqueue_names_the_schema_it_is_given(other_schema):
    naming.use(naming.DEFAULT_SCHEMA)  # this process's own is the default...
    with psycopg.connect(other_schema) as caller:  # ...the call names another
        job = enqueue(caller, "naming_test", {"n": 3}, schema="queueing")
    with psycopg.connect(other_schema) as conn:
        row = conn.execute("SELECT payload FROM queueing.jobs WHERE id = %s", (job,)).fetchone()
    assert row is not None and row[0] == json.loads('{"n": 3}')
    with pytest.raises(ValueError), psycopg.connect(other_schema) as caller:
        enqueue(caller, "naming_test", schema="Not-A-Schema")
