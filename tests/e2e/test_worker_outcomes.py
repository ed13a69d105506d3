"""What a real worker records for each kind of attempt: retries within the backoff bounds,
timeouts retried, permanent errors failed at once, dead_letter -> manual_retry -> completed."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from jobcore import control
from jobcore.schema import jobs
from jobcore.states import Status
from tests.worker.support import all_in, eventually, fetch, read_log, start_worker, submit

pytestmark = pytest.mark.e2e


async def _retry_window(engine, job_id) -> float | None:
    """run_at - updated_at of a job waiting for its retry (one statement set both)."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                sa.select(jobs.c.status, jobs.c.run_at - jobs.c.updated_at).where(
                    jobs.c.id == job_id
                )
            )
        ).one()
    return row[1].total_seconds() if row[0] == Status.PENDING else None


async def _attempts(engine, job_id) -> int:
    return (await fetch(engine, [job_id]))[job_id].attempts


async def test_attempt_outcomes_follow_the_documented_rules(database_url, engine, tmp_path):
    flag = tmp_path / "still-failing"
    flag.touch()
    failing = (await submit(engine, "test.fail", max_attempts=5))[0]
    slow = (await submit(engine, "test.record", {"seconds": 30}, max_attempts=3))[0]
    permanent = (await submit(engine, "test.permanent", max_attempts=5))[0]
    flagged = (await submit(engine, "test.flag", {"path": str(flag)}, max_attempts=1))[0]

    worker = start_worker(
        database_url,
        tmp_path,
        JOB_TIMEOUT="1s",
        LEASE_DURATION="10s",
        BACKOFF_BASE="40s",
        BACKOFF_MAX="60s",
    )
    try:
        # Attempt n waits uniform [c/2, c] with c = min(BACKOFF_BASE * 2^(n-1), BACKOFF_MAX).
        for attempt, (low, high) in enumerate([(20, 40), (30, 60), (30, 60)], start=1):

            async def waiting(attempt: int = attempt) -> float | None:
                if await _attempts(engine, failing) != attempt:
                    return None
                return await _retry_window(engine, failing)

            window = await eventually(waiting, 60, f"the retry after attempt {attempt}")
            assert low <= window <= high, (attempt, window)
            async with engine.begin() as conn:  # skip the wait: due now
                await conn.execute(
                    sa.update(jobs).where(jobs.c.id == failing).values(run_at=sa.func.now())
                )

        # A timeout is a retryable failure: back to pending, attempt spent, error recorded.
        await eventually(lambda: _retry_window(engine, slow), 60, "the timed-out job's retry")
        timed_out = (await fetch(engine, [slow]))[slow]
        assert timed_out.attempts == 1 and "timed out after 1s" in (timed_out.last_error or "")

        # A permanent error fails at once, whatever attempts remain.
        await eventually(lambda: all_in(engine, [permanent], "failed"), 60, "permanent -> failed")
        assert await _attempts(engine, permanent) == 1

        # Dead-lettered on its only attempt; a manual retry after the fix completes it.
        await eventually(lambda: all_in(engine, [flagged], "dead_letter"), 60, "dead_letter")
        flag.unlink()
        async with engine.begin() as conn:
            assert (await control.manual_retry(conn, flagged)) is not None
        await eventually(lambda: all_in(engine, [flagged], "completed"), 60, "completed")
        assert await _attempts(engine, flagged) == 1
        assert [row[2] for row in read_log(worker.exec_log) if row[1] == str(flagged)] == [1, 1]

        finished = worker.messages("job finished")
        outcomes = {(line["job_id"], line["outcome"]) for line in finished}
        assert (str(permanent), "failed") in outcomes
        assert (str(flagged), "dead_letter") in outcomes
        assert (str(flagged), "completed") in outcomes
        assert (str(slow), "retried") in outcomes
        for line in finished:
            assert {"job_id", "job_type", "attempt", "outcome", "duration_ms", "error"} <= set(line)
            assert "retry_in" in line
    finally:
        assert worker.stop(60) == 0
