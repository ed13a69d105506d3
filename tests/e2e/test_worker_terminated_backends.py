"""Backends killed under a draining worker (`pg_terminate_backend` in a loop): every failed
connection is dropped, never used for another statement, and every job still completes."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import sqlalchemy as sa

from tests.worker.support import all_in, eventually, start_worker, submit, until

pytestmark = pytest.mark.e2e

# What asyncpg says when a statement is started on a connection still busy with (or broken
# by) an earlier one: a connection that saw an error was used again.
_REUSED = ("another operation", "InternalClientError")


async def _terminate_worker_backends(engine, stop: asyncio.Event) -> int:
    killed = 0
    while not stop.is_set():
        async with engine.connect() as conn:
            killed += len(
                (
                    await conn.execute(
                        sa.text(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE application_name LIKE 'jobqueue-worker%' "
                            # Only this test's: other tests' workers run beside it.
                            "AND datname = current_database() AND pid <> pg_backend_pid()"
                        )
                    )
                ).all()
            )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.05):
                await stop.wait()
    return killed


async def test_killed_backends_never_carry_another_statement(database_url, engine, tmp_path):
    worker = start_worker(database_url, tmp_path, WORKERS="20", POLL_INTERVAL="0.05s")
    stop = asyncio.Event()
    try:
        await until(lambda: worker.child_pids(), 90, "the worker process")
        ids = await submit(engine, "test.record", {"seconds": 0.01}, count=1000, max_attempts=100)
        killer = asyncio.create_task(_terminate_worker_backends(engine, stop))
        await eventually(lambda: all_in(engine, ids, "completed"), 180, "every job completed")
        stop.set()
        killed = await killer
        assert killed >= 10, "the test must really kill the worker's connections"
        reused = [line for line in worker.lines if any(s in line for s in _REUSED)]
        assert not reused, reused[:5]
        assert not worker.messages("worker process died, restarting")
    finally:
        stop.set()
        assert worker.stop(60) == 0
