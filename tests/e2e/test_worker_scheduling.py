"""Scheduling and routing with a real worker: delayed jobs start on time and never early
whatever POLL_INTERVAL is, one slot drains a queue in claim order, each queue has its own
slots, a queue nobody serves stays pending, and a snoozed job runs again later with its
attempt given back."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
import sqlalchemy as sa

from jobcore.ids import new_id
from jobcore.rows import NewJob
from jobcore.schema import jobs
from tests.worker.support import (
    all_in,
    eventually,
    fetch,
    read_log,
    read_times,
    start_worker,
    submit_jobs,
    until,
)

pytestmark = pytest.mark.e2e

# On a loaded 2-core machine: the benchmark measures the p99 (250 ms target); a test
# only guards against polling (5 s here) and against any early start.
LATE_LIMIT = 1.0


def _new(type: str = "test.stamp", payload=None, max_attempts=3, **fields) -> NewJob:
    payload = {} if payload is None else payload
    return NewJob(new_id(), type, payload, max_attempts, **fields)


async def _run_at(engine, ids) -> dict[str, float]:
    async with engine.connect() as conn:
        rows = await conn.execute(sa.select(jobs.c.id, jobs.c.run_at).where(jobs.c.id.in_(ids)))
        return {str(job_id): run_at.timestamp() for job_id, run_at in rows}


async def test_delayed_jobs_start_on_time_and_never_early_with_slow_polling(
    database_url, engine, tmp_path
):
    worker = start_worker(database_url, tmp_path, POLL_INTERVAL="5s", WORKERS="4")
    try:
        await until(lambda: worker.messages("listening for wake-ups"), 90, "the worker")
        await asyncio.sleep(0.5)  # idle: its next wake-up would be a poll 5 s away
        now = dt.datetime.now(dt.UTC)
        delayed = await submit_jobs(
            engine,
            [_new(delay=1.0 + 0.35 * i) for i in range(6)]
            + [_new(run_at=now + dt.timedelta(seconds=2.2))],
        )
        ids = [job.id for job in delayed]
        due = await _run_at(engine, ids)
        await eventually(lambda: all_in(engine, ids, "completed"), 30, "the delayed jobs")
        started = {job_id: at for job_id, _, at in read_times(worker.exec_log)}
        lateness = {job_id: started[job_id] - due[job_id] for job_id in due}
        assert all(late >= -0.005 for late in lateness.values()), lateness  # never early
        assert max(lateness.values()) < LATE_LIMIT, lateness
    finally:
        assert worker.stop(60) == 0


async def test_one_slot_drains_a_queue_by_priority_then_run_at_then_id(
    database_url, engine, tmp_path
):
    now = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=10)
    at = [now + dt.timedelta(seconds=s) for s in (3, 1, 2)]
    order = [
        _new(priority=5, run_at=at[0]),
        _new(priority=5, run_at=at[1]),
        _new(priority=-3, run_at=at[1]),
        _new(priority=100, run_at=at[2]),
        _new(priority=0, run_at=at[1]),
        _new(priority=0, run_at=at[1]),
    ]
    submitted = await submit_jobs(engine, order)
    expected = sorted(submitted, key=lambda j: (-j.priority, j.run_at, j.id))
    worker = start_worker(database_url, tmp_path, WORKERS="1")
    try:
        ids = [job.id for job in submitted]
        await eventually(lambda: all_in(engine, ids, "completed"), 60, "the queue drained")
    finally:
        assert worker.stop(60) == 0
    ran = [job_id for event, job_id, _, _ in read_log(worker.exec_log) if event == "run"]
    assert ran == [str(job.id) for job in expected]


async def test_each_queue_has_its_own_slots_and_unserved_queues_wait(
    database_url, engine, tmp_path
):
    # The slow queue's running job goes back to pending at the stop: no wait for it.
    worker = start_worker(
        database_url, tmp_path, QUEUES="slow:1,fast:2", WORKERS="8", SHUTDOWN_TIMEOUT="1s"
    )
    try:
        await until(lambda: worker.messages("listening for wake-ups"), 90, "the worker")
        slow = await submit_jobs(
            engine, [_new(payload={"seconds": 30}, queue="slow") for _ in range(4)]
        )
        fast = await submit_jobs(engine, [_new(queue="fast") for _ in range(10)])
        elsewhere = await submit_jobs(engine, [_new(queue="nobody")])
        await eventually(
            lambda: all_in(engine, [j.id for j in fast], "completed"), 20, "the fast queue"
        )
        found = await fetch(engine, [j.id for j in slow + elsewhere])
        assert sorted(found[j.id].status for j in slow) == [
            "pending",
            "pending",
            "pending",
            "processing",
        ]  # one slot in `slow`, however many jobs are waiting there
        assert found[elsewhere[0].id].status == "pending"
    finally:
        assert worker.stop(60) == 0


async def test_a_snoozed_job_runs_again_later_with_its_attempt_given_back(
    database_url, engine, tmp_path
):
    worker = start_worker(database_url, tmp_path, POLL_INTERVAL="5s")
    try:
        await until(lambda: worker.messages("listening for wake-ups"), 90, "the worker")
        payload = {"marker": str(tmp_path / "snoozed"), "seconds": "1.5s"}
        (job,) = await submit_jobs(engine, [_new("test.snooze_once", payload, max_attempts=1)])
        await eventually(lambda: all_in(engine, [job.id], "completed"), 30, "the snoozed job")
        await until(
            lambda: "jobs_snoozed_total 1.0" in worker.get("/metrics").text, 10, "the metric"
        )
    finally:
        assert worker.stop(60) == 0
    starts = [at for job_id, _, at in read_times(worker.exec_log) if job_id == str(job.id)]
    assert len(starts) == 2
    assert 1.5 <= starts[1] - starts[0] < 1.5 + LATE_LIMIT + 0.5
    assert [attempt for _, attempt, _ in read_times(worker.exec_log)] == [1, 1]
    done = (await fetch(engine, [job.id]))[job.id]
    assert done.attempts == 1  # one attempt of max_attempts=1: the snooze did not spend it
    finished = [line for line in worker.messages("job finished") if line["outcome"] == "snoozed"]
    assert len(finished) == 1 and finished[0]["retry_in"] == 1.5


async def test_a_jobs_own_timeout_replaces_job_timeout(database_url, engine, tmp_path):
    worker = start_worker(database_url, tmp_path, JOB_TIMEOUT="60s", LEASE_DURATION="70s")
    try:
        (short,) = await submit_jobs(
            engine, [_new(payload={"seconds": 30}, timeout=1.0, max_attempts=1)]
        )
        (long,) = await submit_jobs(engine, [_new(payload={"seconds": 1.5}, timeout=5.0)])
        await eventually(lambda: all_in(engine, [short.id], "dead_letter"), 30, "the timeout")
        await eventually(lambda: all_in(engine, [long.id], "completed"), 30, "the long job")
    finally:
        assert worker.stop(60) == 0
    found = await fetch(engine, [short.id])
    assert found[short.id].last_error == "JobTimeout: timed out after 1s"
