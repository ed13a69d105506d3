"""Heartbeats with a real worker: a job far longer than its lease runs once and completes; a
frozen holder loses its job after about LEASE_DURATION, and its writes, once it runs again,
are rejected by the fence."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.worker.support import all_in, eventually, fetch, read_log, start_worker, submit, until

pytestmark = pytest.mark.e2e


async def test_a_10s_job_under_a_3s_lease_runs_once_and_completes(database_url, engine, tmp_path):
    worker = start_worker(
        database_url, tmp_path, LEASE_DURATION="3s", JOB_TIMEOUT="60s", RECOVERY_INTERVAL="0.5s"
    )
    try:
        (job,) = await submit(engine, "test.record", {"seconds": 10}, max_attempts=1)
        await eventually(lambda: all_in(engine, [job], "completed"), 60, "the long job")
    finally:
        assert worker.stop(60) == 0
    runs = [r for r in read_log(worker.exec_log) if r[1] == str(job)]
    assert [event for event, *_ in runs] == ["run", "done"]  # once, to the end
    assert (await fetch(engine, [job]))[job].attempts == 1
    assert not worker.messages("job recovered")
    assert not worker.messages("lease lost")


async def test_a_frozen_holder_loses_its_job_after_the_lease_and_cannot_write_after(
    database_url, engine, tmp_path
):
    lease = 3.0
    for name in ("frozen", "other"):
        (tmp_path / name).mkdir()
    frozen = start_worker(
        database_url, tmp_path / "frozen", LEASE_DURATION=f"{lease}s", JOB_TIMEOUT="60s"
    )
    other = None
    pid = None
    try:
        (job,) = await submit(engine, "test.record", {"seconds": 6}, max_attempts=3)
        (run,) = await until(
            lambda: [r for r in read_log(frozen.exec_log) if r[1] == str(job)], 60, "the start"
        )
        pid = run[3]
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        other = start_worker(
            database_url,
            tmp_path / "other",
            LEASE_DURATION=f"{lease}s",
            JOB_TIMEOUT="60s",
            RECOVERY_INTERVAL="0.2s",
        )
        await until(
            lambda: other.messages("job recovered") and other.messages("job started"),
            60,
            "the job recovered and started by the other worker",
        )
        # Not before the frozen holder's lease ran out, and soon after.
        assert lease - 0.5 <= time.monotonic() - stopped_at < lease + 15
        os.kill(pid, signal.SIGCONT)
        await eventually(lambda: all_in(engine, [job], "completed"), 60, "the job completed")
        await until(lambda: frozen.messages("lease lost"), 30, "the frozen holder's lease lost")
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)  # also when the test failed while it was stopped
        for worker in (frozen, other):
            if worker is not None:
                assert worker.stop(60) == 0
    done = (await fetch(engine, [job]))[job]
    assert done.status == "completed" and done.attempts == 2
    # The resumed holder's renewal (or its outcome write) found the lease lost: the job
    # was completed under the other worker's claim only.
    assert [line["job_id"] for line in frozen.messages("lease lost")] == [str(job)]
