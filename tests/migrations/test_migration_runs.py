"""How a migration run behaves, as docs/operations.md ("Migrations") describes it: one run
at a time by a session advisory lock taken by polling, the revisions in one transaction
until a revision's CONCURRENTLY part commits what came before, and a run that fails
leaving what was committed for the next run to finish."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from alembic import command

from jobcore.schema import SCHEMA_REVISION
from tests import pg

MIGRATION_LOCK = 0x6A6F6271756575  # migrations/env.py


def _connect(url: str, autocommit: bool = True) -> psycopg.Connection:
    conn = pg._admin(url)
    conn.autocommit = autocommit
    return conn


def _version(url: str) -> str | None:
    with _connect(url) as conn:
        if conn.execute("SELECT to_regclass('jobqueue.alembic_version')").fetchone() == (None,):
            return None
        row = conn.execute("SELECT version_num FROM jobqueue.alembic_version").fetchone()
        return None if row is None else str(row[0])


def _has_column(url: str, column: str) -> bool:
    with _connect(url) as conn:
        row = conn.execute(
            "SELECT 1 FROM information_schema.columns"
            " WHERE table_schema = 'jobqueue' AND table_name = 'jobs'"
            " AND column_name = %s",
            (column,),
        ).fetchone()
        return row is not None


def test_a_run_waits_for_the_lock_by_polling_without_queueing_on_it(empty_database_url):
    """The lock is a session lock, tried every 0.2 s: the waiting run holds no lock request
    (and no snapshot) that a CREATE INDEX CONCURRENTLY of the lock's holder would wait on."""
    url = empty_database_url
    holder = _connect(url)
    holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
    failed: list[BaseException] = []

    def run() -> None:
        try:
            command.upgrade(pg.alembic_config(url), "head")
        except BaseException as exc:  # reported below
            failed.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    try:
        time.sleep(1.5)
        assert runner.is_alive() and _version(url) is None  # it waits
        with _connect(url) as conn:
            queued = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()
        assert queued == (0,)
    finally:
        holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
        holder.close()
        runner.join(120)
    assert not failed and not runner.is_alive()
    assert _version(url) == SCHEMA_REVISION


def test_a_run_that_fails_in_a_revisions_first_part_leaves_that_revision_undone(
    empty_database_url,
):
    """0005 adds its columns under `lock_timeout = 5s`: behind a transaction that holds the
    table, it gives up, and its transactional part is rolled back."""
    url = empty_database_url
    config = pg.alembic_config(url)
    command.upgrade(config, "0004")
    holder = _connect(url, autocommit=False)
    holder.execute("SELECT count(*) FROM jobqueue.jobs")  # a transaction holding ACCESS SHARE
    try:
        started = time.monotonic()
        with pytest.raises(Exception, match="lock timeout"):
            command.upgrade(config, "head")
        assert 4.5 < time.monotonic() - started < 30
    finally:
        holder.rollback()
        holder.close()
    assert _version(url) == "0004" and not _has_column(url, "finished_at")
    command.upgrade(config, "head")
    assert _version(url) == SCHEMA_REVISION and _has_column(url, "finished_at")


def test_a_run_that_fails_after_a_concurrently_part_keeps_what_was_committed(
    empty_database_url,
):
    """From 0003: 0004's index build commits what came before it; 0005's commits 0004's
    record and its own columns; then 0005's VALIDATE fails. The revisions before 0005 stay
    applied and recorded, 0005's columns stay (not recorded), and once the bad row is gone
    the next run applies 0005 again (each revision may run again) and finishes."""
    url = empty_database_url
    config = pg.alembic_config(url)
    command.upgrade(config, "0003")
    with _connect(url) as conn:  # a row no status check allows
        conn.execute("ALTER TABLE jobqueue.jobs DROP CONSTRAINT jobs_status_check")
        conn.execute(
            "INSERT INTO jobqueue.jobs (id, type, payload, status, max_attempts)"
            " VALUES (gen_random_uuid(), 'sleep', '{}', 'bogus', 3)"
        )
    with pytest.raises(Exception, match="jobs_status_check"):
        command.upgrade(config, "head")
    assert _version(url) == "0004"
    assert _has_column(url, "finished_at")  # 0005's first part, committed before its build
    with _connect(url) as conn:
        assert conn.execute("SELECT to_regclass('jobqueue.jobs_claim_type_idx')").fetchone() != (
            None,
        )
        conn.execute("DELETE FROM jobqueue.jobs WHERE status = 'bogus'")
    command.upgrade(config, "head")
    assert _version(url) == SCHEMA_REVISION
