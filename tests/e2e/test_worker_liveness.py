"""Handlers that hang or block: plain handlers that never return cannot starve the slots,
and a worker process whose event loop stops turning is noticed, reported and replaced."""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.procs import wait_for
from tests.worker.support import (
    Worker,
    all_in,
    eventually,
    fetch,
    read_log,
    start_worker,
    submit,
    until,
)

pytestmark = pytest.mark.e2e

FAST_RECOVERY = {"LEASE_DURATION": "8s", "RECOVERY_INTERVAL": "0.5s", "BACKOFF_BASE": "60s"}
# The supervisor's limits (jobqueue_worker.supervisor): 503 from 5 s, killed at 10 s.
STALL_LIMIT = 10.0
# Exits in a row before it started after which the supervisor gives up on a worker process.
START_ATTEMPTS = 5


def _metric(worker: Worker, name: str) -> float:
    for family in text_string_to_metric_families(worker.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return float(sample.value)
    raise AssertionError(f"no metric {name}")


def _runs(worker: Worker, job: Any, event: str = "run") -> list[tuple[str, str, int, int]]:
    return [r for r in read_log(worker.exec_log) if r[1] == str(job) and r[0] == event]


async def test_hung_sync_handlers_do_not_keep_quick_sync_jobs_from_running(
    database_url, engine, tmp_path
):
    worker = start_worker(database_url, tmp_path, WORKERS="2", JOB_TIMEOUT="1s", **FAST_RECOVERY)
    try:
        await until(lambda: worker.status_of("/readyz") == 200, 60, "ready")
        hung = await submit(engine, "test.sleep_sync", {"seconds": 40}, max_attempts=1, count=2)
        await eventually(
            lambda: all_in(engine, hung, "dead_letter"), 30, "both hung jobs timed out"
        )
        # Both threads still run, abandoned; each slot runs the next job in a new thread.
        quick = await submit(engine, "test.sleep_sync", {"seconds": 0}, max_attempts=1, count=3)
        await eventually(lambda: all_in(engine, quick, "completed"), 30, "the quick jobs")
        for job in quick:
            assert len(_runs(worker, job, "done")) == 1
        for job in hung:
            assert _runs(worker, job) and not _runs(worker, job, "done")
        abandoned = worker.messages("handler thread abandoned")
        assert sorted(line["job_id"] for line in abandoned) == sorted(str(j) for j in hung)
        assert _metric(worker, "worker_abandoned_handlers") == 2
        assert worker.status_of("/readyz") == 200  # every slot can run a job
    finally:
        started = time.monotonic()
        assert worker.stop(60) == 0
    assert time.monotonic() - started < 15  # the hung threads do not hold the exit


async def test_more_abandoned_handlers_than_slots_recycle_the_worker_process(
    database_url, engine, tmp_path
):
    worker = start_worker(database_url, tmp_path, WORKERS="1", JOB_TIMEOUT="0.5s", **FAST_RECOVERY)
    try:
        await until(lambda: worker.status_of("/readyz") == 200, 60, "ready")
        hung = await submit(engine, "test.sleep_sync", {"seconds": 40}, max_attempts=1, count=2)
        await eventually(
            lambda: all_in(engine, hung, "dead_letter"), 30, "both hung jobs timed out"
        )
        await until(lambda: len(worker.child_pids()) == 2, 60, "a fresh worker process")
        (recycling,) = worker.messages("too many abandoned handlers, recycling the worker process")
        assert recycling["abandoned_handlers"] == 2 and recycling["limit"] == 1
        (recycled,) = worker.messages("worker process recycled, restarting")
        assert recycled["pid"] == worker.child_pids()[0] and recycled["exitcode"] == 3
        (after,) = await submit(engine, "test.record")
        await eventually(lambda: all_in(engine, [after], "completed"), 30, "a job after it")
        assert _metric(worker, "worker_process_recycles_total") == 1
        assert _metric(worker, "worker_abandoned_handlers") == 0  # gone with their process
    finally:
        assert worker.stop(60) == 0


async def test_a_handler_blocking_the_event_loop_gets_its_process_replaced(
    database_url, engine, tmp_path
):
    worker = start_worker(database_url, tmp_path, WORKERS="4", JOB_TIMEOUT="2s", **FAST_RECOVERY)
    try:
        await until(lambda: worker.status_of("/readyz") == 200, 60, "ready")
        (blocker,) = await submit(engine, "test.block_loop", {"seconds": 60}, max_attempts=1)
        (run,) = await until(lambda: _runs(worker, blocker), 30, "the blocking handler to start")
        blocked_at, stalled_pid = time.monotonic(), run[3]
        # Submitted while the process is stuck: its free slots cannot take them.
        waiting = await submit(engine, "test.record", count=3)

        def reports_stall() -> bool:
            response = worker.get("/readyz")
            return (
                response.status_code == 503
                and response.json()["status"] == "worker process stalled"
            )

        await until(reports_stall, STALL_LIMIT, "/readyz to report the stall")
        assert worker.status_of("/healthz") == 200
        (killed,) = await until(
            lambda: worker.messages("worker process stalled, killing it"), 30, "the stall kill"
        )
        assert time.monotonic() - blocked_at < STALL_LIMIT + 5
        assert killed["pid"] == stalled_pid and killed["job_id"] == str(blocker)
        assert killed["stalled_for"] >= STALL_LIMIT
        assert any("handlers.py" in frame for frame in killed["where"])
        (blocked,) = worker.messages("event loop blocked")
        assert blocked["job_id"] == str(blocker) and blocked["pid"] == stalled_pid

        await eventually(lambda: all_in(engine, waiting, "completed"), 60, "the waiting jobs")
        assert all(_runs(worker, job)[0][3] != stalled_pid for job in waiting)
        # The stuck attempt counted: recovery dead-letters a job out of attempts.
        await eventually(lambda: all_in(engine, [blocker], "dead_letter"), 60, "dead_letter")
        assert (await fetch(engine, [blocker]))[blocker].attempts == 1
        assert _metric(worker, "worker_process_stalls_total") == 1
        await until(lambda: worker.status_of("/readyz") == 200, 30, "ready again")
    finally:
        assert worker.stop(60) == 0


async def test_sigterm_while_the_event_loop_is_blocked_exits_promptly(
    database_url, engine, tmp_path
):
    worker = start_worker(database_url, tmp_path, JOB_TIMEOUT="2s", **FAST_RECOVERY)
    try:
        await until(lambda: worker.status_of("/readyz") == 200, 60, "ready")
        (blocker,) = await submit(engine, "test.block_loop", {"seconds": 60}, max_attempts=2)
        await until(lambda: _runs(worker, blocker), 30, "the blocking handler to start")
        await until(lambda: worker.messages("event loop blocked"), 10, "the child's report")
    finally:
        started = time.monotonic()
        code = worker.stop(60)
        took = time.monotonic() - started
    assert code == 0
    assert took < 6.0  # not SHUTDOWN_TIMEOUT (20 s) plus a SIGKILL
    (killed,) = worker.messages("worker process stalled, killing it")
    assert killed["job_id"] == str(blocker)


def test_a_worker_process_that_cannot_start_fails_healthz_and_the_supervisor_gives_up(
    database_url, tmp_path
):
    worker = start_worker(
        database_url,
        tmp_path,
        JOB_HANDLERS="tests.worker.handlers,tests.e2e.refusing_handlers",
    )
    try:

        def restarted() -> bool:
            assert worker.proc.poll() is None, worker.output()
            return any(
                line["msg"].startswith("worker process") and "restarting" in line["msg"]
                for line in worker.logs()
            )

        wait_for(restarted, 60, "a worker process to fail and be restarted")
        # From then on no worker process starts: liveness fails until the supervisor gives up.
        deadline = time.monotonic() + 60
        while worker.proc.poll() is None:
            assert worker.status_of("/healthz") in (503, None), worker.output()
            assert time.monotonic() < deadline, "the supervisor restarts it forever"
            time.sleep(0.1)
        assert worker.wait(10) == 1
    finally:
        if worker.proc.poll() is None:
            worker.kill()
    (gave_up,) = [line for line in worker.logs() if line["level"] == "error" and "exc" not in line]
    assert gave_up["msg"] == "worker process cannot start: giving up"
    assert gave_up["start_failures"] == START_ATTEMPTS
    assert len(worker.messages("worker process failed")) == START_ATTEMPTS
