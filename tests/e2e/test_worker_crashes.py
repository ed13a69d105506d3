"""Worker processes that die mid-job: the supervisor restarts them and no job is lost."""

from __future__ import annotations

import os
import signal

import pytest

from tests.worker.support import all_in, eventually, fetch, read_log, start_worker, submit, until

pytestmark = pytest.mark.e2e

# Short leases so an abandoned job comes back within seconds.
FAST_RECOVERY = {"JOB_TIMEOUT": "3s", "LEASE_DURATION": "8.5s", "RECOVERY_INTERVAL": "0.5s"}


async def test_a_child_killed_mid_job_is_restarted_and_the_job_completes_after_its_lease(
    database_url, engine, tmp_path
):
    worker = start_worker(database_url, tmp_path, **FAST_RECOVERY)
    try:
        (job,) = await submit(engine, "test.block", {"block_attempts": 1})
        first = await until(
            lambda: [r for r in read_log(worker.exec_log) if r[1] == str(job)], 60, "attempt 1"
        )
        pid = first[0][3]
        os.kill(pid, signal.SIGKILL)

        await eventually(lambda: all_in(engine, [job], "completed"), 90, "the job to complete")
        done = (await fetch(engine, [job]))[job]
        assert done.attempts == 2
        pids = worker.child_pids()
        assert pids[0] == pid and len(pids) == 2  # restarted once, as a new process
        (died,) = worker.messages("worker process died, restarting")
        assert died["pid"] == pid and died["exitcode"] == -signal.SIGKILL
        assert [line["job_id"] for line in worker.messages("job recovered")] == [str(job)]
    finally:
        assert worker.stop(60) == 0


async def test_a_poison_pill_ends_in_dead_letter_and_the_service_stays_healthy(
    database_url, engine, tmp_path
):
    worker = start_worker(
        database_url,
        tmp_path,
        **{**FAST_RECOVERY, "JOB_TIMEOUT": "0.5s", "LEASE_DURATION": "5.6s"},
    )
    try:
        (pill,) = await submit(engine, "test.crash", max_attempts=2)
        await eventually(lambda: all_in(engine, [pill], "dead_letter"), 120, "dead_letter")
        runs = [r for r in read_log(worker.exec_log) if r[1] == str(pill)]
        assert [attempt for _, _, attempt, _ in runs] == [1, 2]  # each attempt killed a process
        assert worker.status_of("/healthz") == 200

        # The service goes on working once a fresh process is up.
        (good,) = await submit(engine, "test.record")
        await eventually(lambda: all_in(engine, [good], "completed"), 60, "a normal job")
        assert len(worker.messages("worker process died, restarting")) == 2
        assert worker.status_of("/healthz") == 200
        assert worker.status_of("/readyz") == 200
    finally:
        assert worker.stop(60) == 0
