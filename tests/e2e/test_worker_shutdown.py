"""Graceful shutdown of a real worker (docs/worker.md, "Shutdown"): finish and record running
jobs, claim nothing new, release what outlives SHUTDOWN_TIMEOUT, exit 0; a second signal is
immediate."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.worker.support import count_by_status, fetch, read_log, start_worker, submit, until

pytestmark = pytest.mark.e2e


def _started(worker, ids) -> bool:
    running = {job_id for event, job_id, _, _ in read_log(worker.exec_log) if event == "run"}
    return {str(i) for i in ids} <= running


async def test_shutdown_finishes_running_jobs_and_claims_nothing_new(
    database_url, engine, tmp_path
):
    worker = start_worker(
        database_url, tmp_path, WORKERS="2", WORKER_PROCESSES="2", SHUTDOWN_TIMEOUT="30s"
    )
    await until(lambda: len(worker.child_pids()) == 2, 60, "two worker processes")
    running = await submit(engine, "test.record", {"seconds": 2}, count=2)
    await until(lambda: _started(worker, running), 60, "both jobs running")
    assert worker.status_of("/readyz") == 200

    worker.signal(signal.SIGTERM)
    waiting = await submit(engine, "test.record", count=3)
    await until(lambda: worker.status_of("/readyz") == 503, 10, "/readyz 503 while draining")
    assert worker.status_of("/healthz") == 200
    assert worker.wait(60) == 0

    finished = await fetch(engine, running)
    assert all(j.status == "completed" and j.attempts == 1 for j in finished.values())
    untouched = await fetch(engine, waiting)
    assert all(j.status == "pending" and j.attempts == 0 for j in untouched.values())
    assert len(worker.messages("worker process stopped")) == 2
    assert worker.messages("worker stopped")


async def test_jobs_outliving_shutdown_timeout_go_back_to_pending_with_attempts_unchanged(
    database_url, engine, tmp_path
):
    worker = start_worker(
        database_url,
        tmp_path,
        WORKERS="3",
        SHUTDOWN_TIMEOUT="1s",
        JOB_TIMEOUT="120s",
        LEASE_DURATION="130s",
    )
    ids = [
        *await submit(engine, "test.record", {"seconds": 120}, count=2),
        # A plain def handler cannot be cancelled: its thread must not hold the exit.
        *await submit(engine, "test.sleep_sync", {"seconds": 120}),
    ]
    await until(lambda: _started(worker, ids), 60, "three jobs running")
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0
    assert time.monotonic() - started < 20
    released = await fetch(engine, ids)
    assert all(j.status == "pending" and j.attempts == 0 for j in released.values())
    assert all(j.locked_until is None for j in released.values())
    outcomes = [line["outcome"] for line in worker.messages("job finished")]
    assert outcomes == ["released"] * 3


async def test_a_second_signal_stops_the_worker_at_once(database_url, engine, tmp_path):
    worker = start_worker(
        database_url, tmp_path, SHUTDOWN_TIMEOUT="60s", JOB_TIMEOUT="120s", LEASE_DURATION="130s"
    )
    (job,) = await submit(engine, "test.record", {"seconds": 120})
    await until(lambda: _started(worker, [job]), 60, "the job running")
    worker.signal(signal.SIGTERM)
    await until(lambda: worker.messages("shutting down"), 10, "the graceful shutdown")
    started = time.monotonic()
    worker.signal(signal.SIGINT)
    assert worker.wait(30) != 0
    assert time.monotonic() - started < 5
    # The job was abandoned, not lost: it is still leased, and recovery takes it back later.
    assert (await count_by_status(engine)) == {"processing": 1}


async def test_a_sigterm_to_the_whole_process_group_is_one_graceful_shutdown(
    database_url, engine, tmp_path
):
    # As a terminal or a process manager signals a group: the fork server the worker
    # processes come from gets it too, and must stay up to report their exits.
    worker = start_worker(database_url, tmp_path, WORKER_PROCESSES="2", SHUTDOWN_TIMEOUT="30s")
    await until(lambda: len(worker.child_pids()) == 2, 60, "two worker processes")
    (job,) = await submit(engine, "test.record", {"seconds": 2})
    await until(lambda: _started(worker, [job]), 60, "the job running")

    os.killpg(worker.proc.pid, signal.SIGTERM)
    assert worker.wait(60) == 0

    assert (await fetch(engine, [job]))[job].status == "completed"
    exited = worker.messages("worker process exited")
    assert sorted(line["pid"] for line in exited) == sorted(worker.child_pids())
    assert [line["exitcode"] for line in exited] == [0, 0]
    assert len(worker.messages("worker process stopped")) == 2


async def test_worker_processes_stop_gracefully_when_the_supervisor_is_killed(
    database_url, engine, tmp_path
):
    worker = start_worker(database_url, tmp_path, WORKER_PROCESSES="2", SHUTDOWN_TIMEOUT="30s")
    await until(lambda: len(worker.child_pids()) == 2, 60, "two worker processes")
    (job,) = await submit(engine, "test.record", {"seconds": 2})
    await until(lambda: _started(worker, [job]), 60, "the job running")

    worker.proc.kill()  # the supervisor alone
    worker.proc.wait(10)
    await until(
        lambda: len(worker.messages("worker process stopped")) == 2, 30, "both processes stopped"
    )
    assert len(worker.messages("supervisor is gone, shutting down")) == 2
    assert (await fetch(engine, [job]))[job].status == "completed"
    await until(lambda: not any(_alive(pid) for pid in worker.child_pids()), 10, "their exit")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
