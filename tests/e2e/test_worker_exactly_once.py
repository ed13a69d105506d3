"""Three worker services of two processes each, racing on one database, run every job once."""

from __future__ import annotations

import collections

import pytest
import sqlalchemy as sa

from jobcore.schema import jobs
from tests.worker.support import count_by_status, eventually, read_log, start_worker, submit, until

pytestmark = pytest.mark.e2e

JOBS = 600


async def test_competing_workers_run_each_job_exactly_once(database_url, engine, tmp_path):
    workers = []
    try:
        for i in range(3):
            home = tmp_path / f"worker-{i}"
            home.mkdir()
            workers.append(
                start_worker(
                    database_url,
                    home,
                    WORKER_PROCESSES="2",
                    WORKERS="4",
                    POLL_INTERVAL="0.1s",
                    # One execution log for all, so a duplicate would show up in it.
                    WORKER_TEST_LOG=str(tmp_path / "executions.log"),
                )
            )
        # Every process polls before the first job exists, so all six really compete.
        await until(
            lambda: sum(len(w.child_pids()) for w in workers) == 6, 120, "six worker processes"
        )
        ids = await submit(engine, "test.record", {"seconds": 0.02}, count=JOBS)

        async def all_completed() -> bool:
            return (await count_by_status(engine)).get("completed") == JOBS

        await eventually(all_completed, 120, f"{JOBS} completed jobs")
    finally:
        codes = [w.stop(60) for w in workers]
    assert codes == [0, 0, 0]

    runs = [row for row in read_log(tmp_path / "executions.log") if row[0] == "run"]
    per_job = collections.Counter(job_id for _, job_id, _, _ in runs)
    assert set(per_job) == {str(i) for i in ids}
    assert max(per_job.values()) == 1  # nobody ran a job a second time
    assert {attempt for _, _, attempt, _ in runs} == {1}
    async with engine.connect() as conn:
        assert await conn.scalar(sa.select(sa.func.max(jobs.c.attempts))) == 1
    # All six processes took part, so the claims really raced.
    pids = {pid for _, _, _, pid in runs}
    assert pids == {pid for w in workers for pid in w.child_pids()}
    assert not any(w.messages("lease lost") for w in workers)
