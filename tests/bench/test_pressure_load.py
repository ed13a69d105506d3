"""The pressure benchmark's readings of the database: completions and claim latencies
count every job kept, in `jobs` or moved to `jobs_history`."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import sqlalchemy as sa

from bench import pressure_load as load
from jobcore.ids import new_id
from jobcore.schema import jobs
from tests.pg import move


async def _completed(engine, started: float, finished: float) -> str:
    job_id = new_id()
    async with engine.begin() as conn:
        await conn.execute(
            sa.insert(jobs).values(
                id=job_id,
                type="t",
                payload={},
                status="completed",
                attempts=1,
                max_attempts=3,
                run_at=sa.func.to_timestamp(started),
                finished_at=sa.func.to_timestamp(finished),
            )
        )
    return str(job_id)


async def test_completions_and_claim_latencies_count_the_jobs_moved_to_the_history(
    engine, database_url
):
    t0 = float(int(time.time()))
    kept = await _completed(engine, t0, t0 + 0.5)
    moved = await _completed(engine, t0 + 1, t0 + 1.5)
    await move(engine, [moved])
    conn = await asyncpg.connect(database_url)
    try:
        assert await load.completions(conn, t0, t0 + 2) == {0: 1, 1: 1}
        loop = asyncio.get_running_loop()
        marked = []
        for job, at in ((kept, t0 + 0.25), (moved, t0 + 1.75)):
            future = loop.create_future()
            future.set_result((at, 0))
            marked.append((future, job))
        starts, unstarted = await load.handler_starts(conn, marked)
    finally:
        await conn.close()
    assert sorted(starts) == [(t0 + 0.25, 0.25), (t0 + 1.75, 0.75)]
    assert unstarted == 0
