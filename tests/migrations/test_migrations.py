"""Alembic owns the schema (docs/operations.md, "Migrations"): upgrade, re-run, concurrent
runs, downgrade, no drift."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url

from jobcore import history
from jobcore.schema import SCHEMA_REVISION, jobs, metadata
from tests import pg
from tests.procs import BIN


def _sync_engine(url: str) -> sa.Engine:
    return sa.create_engine(make_url(url).set(drivername="postgresql+psycopg"))


def _state(url: str) -> tuple[str | None, bool]:
    engine = _sync_engine(url)
    try:
        with engine.connect() as conn:
            version = None
            if conn.scalar(sa.text("SELECT to_regclass('jobqueue.alembic_version') IS NOT NULL")):
                version = conn.scalar(sa.text("SELECT version_num FROM jobqueue.alembic_version"))
            has_jobs = conn.scalar(sa.text("SELECT to_regclass('jobqueue.jobs') IS NOT NULL"))
        return version, bool(has_jobs)
    finally:
        engine.dispose()


def test_code_expects_the_latest_revision():
    script = ScriptDirectory.from_config(pg.alembic_config("postgresql://unused/x"))
    assert script.get_current_head() == SCHEMA_REVISION


def test_upgrade_creates_the_schema_and_running_it_again_changes_nothing(empty_database_url):
    config = pg.alembic_config(empty_database_url)
    command.upgrade(config, "head")
    assert _state(empty_database_url) == (SCHEMA_REVISION, True)
    command.upgrade(config, "head")
    assert _state(empty_database_url) == (SCHEMA_REVISION, True)


def test_three_concurrent_upgrades_apply_the_schema_once(empty_database_url):
    env = {**os.environ, "DATABASE_URL": empty_database_url}
    procs = [
        subprocess.Popen(
            [str(BIN / "alembic"), "upgrade", "head"],
            cwd=pg.ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], outputs
    assert sum("Running upgrade  -> 0001" in out for out in outputs) == 1, outputs
    assert _state(empty_database_url) == (SCHEMA_REVISION, True)


def test_downgrade_to_base_removes_the_schema(empty_database_url):
    config = pg.alembic_config(empty_database_url)
    command.upgrade(config, "head")
    command.downgrade(config, "base")
    assert _state(empty_database_url) == (None, False)


def test_migrated_schema_matches_the_table_definitions(database_url):
    engine = _sync_engine(database_url)
    try:
        with engine.connect() as conn:
            options = {
                "include_schemas": True,
                "include_name": lambda name, kind, _: kind != "schema" or name == "jobqueue",
                "version_table_schema": "jobqueue",
            }
            diff = compare_metadata(MigrationContext.configure(conn, opts=options), metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_hot_table_storage_settings_are_applied(database_url):
    engine = _sync_engine(database_url)
    try:
        with engine.connect() as conn:
            options = conn.scalar(
                sa.text("SELECT reloptions FROM pg_class WHERE oid = 'jobqueue.jobs'::regclass")
            )
    finally:
        engine.dispose()
    assert "fillfactor=70" in options
    assert any(o.startswith("autovacuum_vacuum_scale_factor=") for o in options)


def test_upgrading_a_populated_table_rewrites_nothing_and_downgrades_cleanly(empty_database_url):
    config = pg.alembic_config(empty_database_url)
    command.upgrade(config, "0001")
    engine = _sync_engine(empty_database_url)
    relfilenode = sa.text("SELECT relfilenode FROM pg_class WHERE oid = 'jobqueue.jobs'::regclass")
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO jobqueue.jobs (id, type, payload, max_attempts) SELECT"
                    " gen_random_uuid(), 'sleep', '{}', 3 FROM generate_series(1, 100000)"
                )
            )
            before = conn.scalar(relfilenode)
        command.upgrade(config, "head")
        with engine.connect() as conn:
            assert conn.scalar(relfilenode) == before  # no table rewrite
            assert conn.scalar(sa.text("SELECT count(*) FROM jobqueue.jobs")) == 100000
        command.downgrade(config, "0001")
        with engine.connect() as conn:  # created in the schema, it stays there
            assert conn.scalar(sa.text("SELECT count(*) FROM jobqueue.jobs")) == 100000
    finally:
        engine.dispose()


def test_an_upgrade_interrupted_after_its_first_commit_can_be_run_again(empty_database_url):
    """0003 and 0004 commit their first part before building an index CONCURRENTLY; a run
    killed during the build leaves that part behind, and the next run must still pass."""
    config = pg.alembic_config(empty_database_url)
    command.upgrade(config, "0002")
    engine = _sync_engine(empty_database_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text("ALTER TABLE jobqueue.jobs ADD COLUMN queue text NOT NULL DEFAULT 'x'")
            )
            conn.execute(
                sa.text(
                    "ALTER TABLE jobqueue.jobs ADD CONSTRAINT jobs_priority_check"
                    " CHECK (true) NOT VALID"
                )
            )
            conn.execute(
                sa.text(
                    "CREATE TABLE jobqueue.job_rate_windows (type text PRIMARY KEY,"
                    " window_start timestamptz NOT NULL, used integer NOT NULL)"
                )
            )
    finally:
        engine.dispose()
    command.upgrade(config, "0003")
    command.upgrade(config, "head")
    assert _state(empty_database_url) == (SCHEMA_REVISION, True)


def test_downgrading_past_the_history_moves_its_jobs_back(empty_database_url):
    config = pg.alembic_config(empty_database_url)
    command.upgrade(config, "head")
    engine = _sync_engine(empty_database_url)
    columns = ", ".join(jobs.c.keys())
    leaf = history.leaf_at(datetime.now(UTC), history.HOUR, [])
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO jobqueue.jobs (id, type, payload, max_attempts, status,"
                    " attempts, result, finished_at) SELECT gen_random_uuid(), 'sleep',"
                    " '{}', 3, 'completed', 1, '{\"n\": 1}', now()"
                    " FROM generate_series(1, 10)"
                )
            )
            before = conn.execute(sa.text(f"SELECT {columns} FROM jobqueue.jobs")).all()
            for sql in history.create_sql(leaf):
                conn.execute(sa.text(sql))
            conn.execute(
                sa.text(
                    f"WITH moved AS (DELETE FROM jobqueue.jobs RETURNING {columns})"
                    f" INSERT INTO jobqueue.jobs_history ({columns}) SELECT {columns} FROM moved"
                )
            )
        command.downgrade(config, "0013")
        with engine.connect() as conn:
            after = conn.execute(sa.text(f"SELECT {columns} FROM jobqueue.jobs")).all()
            assert sorted(after) == sorted(before) and len(after) == 10
            assert conn.scalar(sa.text("SELECT to_regclass('jobqueue.jobs_history')")) is None
            assert conn.scalar(sa.text(f"SELECT to_regclass('jobqueue.{leaf.name}')")) is None
        command.upgrade(config, "head")
        assert _state(empty_database_url) == (SCHEMA_REVISION, True)
    finally:
        engine.dispose()
