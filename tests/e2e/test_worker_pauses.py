"""A paused queue, with real worker processes: within a second of the pause no process
claims from it, the jobs running finish, submissions still land (and wait), other queues go
on, the gauge says so; once resumed its jobs run."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
import sqlalchemy as sa

from jobcore import pauses, store
from jobcore.db import make_engine
from jobcore.ids import new_id
from jobcore.rows import NewJob
from jobcore.schema import jobs
from tests.worker.support import eventually, start_worker, until

pytestmark = pytest.mark.e2e

# Far longer than the test: anything picked up on time was woken or read the pause itself.
POLL = "60s"


async def _submit(engine, n: int, queue: str, seconds: float) -> list:
    async with engine.begin() as conn:
        found = []
        for _ in range(n):
            new = NewJob(new_id(), "test.record", {"seconds": seconds}, 3, queue=queue)
            job, _ = await store.submit(conn, new, notify=True)
            found.append(job.id)
    return found


async def _statuses(engine, ids) -> dict:
    async with engine.connect() as conn:
        rows = await conn.execute(sa.select(jobs.c.id, jobs.c.status).where(jobs.c.id.in_(ids)))
        return dict(rows.all())


def _paused_gauge(worker, queue: str) -> float | None:
    text = worker.get("/metrics").text
    found = re.search(rf'^jobs_queue_paused{{queue="{queue}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else None


async def test_pause_with_jobs_running_and_due_then_resume(database_url, engine, tmp_path):
    auto = make_engine(database_url, pool_size=2, isolation_level="AUTOCOMMIT")
    worker = start_worker(
        database_url,
        tmp_path,
        WORKER_PROCESSES="2",
        WORKERS="3",
        QUEUES="default:3,other:3",
        POLL_INTERVAL=POLL,
    )
    try:
        await until(lambda: len(worker.child_pids()) == 2, 90, "both worker processes")
        await until(lambda: len(worker.messages("listening for wake-ups")) >= 2, 30, "listeners")
        first = await _submit(engine, 30, "default", 2.0)

        async def running() -> bool:
            found = await _statuses(engine, first)
            return sum(s == "processing" for s in found.values()) == 6

        await eventually(running, 20, "every slot of the queue busy")
        async with auto.connect() as conn:
            await pauses.pause(conn, "default")
        paused_at = time.monotonic()
        await asyncio.sleep(1.0)
        taken = {i for i, s in (await _statuses(engine, first)).items() if s != "pending"}
        assert 6 <= len(taken) < 30
        # Submissions still land; another queue still runs.
        later = await _submit(engine, 5, "default", 0)
        others = await _submit(engine, 5, "other", 0)

        async def others_done() -> bool:
            return set((await _statuses(engine, others)).values()) == {"completed"}

        await eventually(others_done, 15, "the other queue's jobs")
        # The jobs running at the pause finish; nothing more is claimed from the queue.
        while time.monotonic() - paused_at < 4.0:
            now = await _statuses(engine, first + later)
            started = {i for i, s in now.items() if s != "pending"}
            assert started == taken, "a job was claimed from a paused queue"
            await asyncio.sleep(0.2)
        now = await _statuses(engine, first)
        assert {now[i] for i in taken} == {"completed"}
        await until(lambda: _paused_gauge(worker, "default") == 1.0, 15, "the paused gauge")
        assert _paused_gauge(worker, "other") == 0.0

        async with auto.connect() as conn:
            await pauses.resume(conn, "default")

        async def all_done() -> bool:
            return set((await _statuses(engine, first + later)).values()) == {"completed"}

        await eventually(all_done, 40, "the resumed queue's jobs")
        await until(lambda: _paused_gauge(worker, "default") == 0.0, 15, "the gauge back at 0")
    finally:
        await auto.dispose()
        assert worker.stop(60) == 0
