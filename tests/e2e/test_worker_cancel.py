"""Cancel of running jobs with the real `jobqueue-worker`: the request (`jobcore.control.cancel`,
as the API makes it) stops the attempt within a second; a cancel racing the handler's end
leaves exactly one outcome; a job whose holder died is recovered as cancelled."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from datetime import timedelta
from uuid import UUID

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import control
from jobcore.control import Cancelled
from jobcore.db import session_name
from jobcore.ids import new_id
from jobcore.rows import Job, NewJob
from tests.worker.support import (
    Worker,
    all_in,
    eventually,
    fetch,
    read_log,
    read_times,
    start_worker,
    submit,
    submit_jobs,
    until,
)

pytestmark = pytest.mark.e2e

_SECOND = timedelta(seconds=1)


async def _cancel(engine: AsyncEngine, job_id: UUID) -> tuple[Job, Cancelled]:
    """Request the cancel in a transaction of its own, as the API does."""
    async with engine.begin() as conn:
        found = await control.cancel(conn, job_id)
    assert found is not None
    return found


def _counter(worker: Worker, name: str) -> float:
    text = worker.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return sample.value
    raise AssertionError(f"{name} is not exported")


def _events(worker: Worker, job_id: UUID) -> list[str]:
    return [event for event, job, _, _ in read_log(worker.exec_log) if job == str(job_id)]


async def test_a_running_async_job_and_a_running_sync_job_end_cancelled_within_a_second(
    database_url, engine, tmp_path
):
    worker = start_worker(database_url, tmp_path, JOB_TIMEOUT="5m")
    try:
        # The built-in sleep (async) and a plain def handler that polls ctx.cancelled.
        (asleep,) = await submit(engine, "sleep", {"duration": "60s"})
        (polling,) = await submit(engine, "test.stoppable", {"seconds": 60})
        await until(lambda: _events(worker, polling) == ["run"], 60, "the sync handler running")
        await until(
            lambda: str(asleep) in {line["job_id"] for line in worker.messages("job started")},
            60,
            "the sleep job started",
        )
        for job_id in (asleep, polling):
            job, what = await _cancel(engine, job_id)
            assert what is Cancelled.REQUESTED and job.cancel_requested_at is not None
            committed = time.monotonic()

            async def ended(job_id: UUID = job_id) -> bool:
                return await all_in(engine, [job_id], "cancelled")

            await eventually(ended, 5, "the job cancelled", interval=0.01)
            seen_after = time.monotonic() - committed
            ended_job = (await fetch(engine, [job_id]))[job_id]
            assert ended_job.finished_at is not None and ended_job.cancel_requested_at is not None
            # By the database's clock: from the cancel's transaction to the worker's write.
            assert ended_job.finished_at - ended_job.cancel_requested_at < _SECOND, ended_job
            assert seen_after < 1.0
            assert ended_job.attempts == 1 and ended_job.result is None
        assert _events(worker, polling) == ["run", "stopped"]  # it returned, told to stop

        finished = {line["job_id"]: line for line in worker.messages("job finished")}
        for job_id in (asleep, polling):
            assert finished[str(job_id)]["outcome"] == "cancelled"
        stopping = worker.messages("cancel requested, stopping the attempt")
        assert sorted(line["job_id"] for line in stopping) == sorted([str(asleep), str(polling)])
        assert {line["via"] for line in stopping} == {"notification"}
        assert not worker.messages("handler thread abandoned")
        assert _counter(worker, "jobs_cancelled_total") == 2

        # A second request for a job that has ended is refused; the worker is unaffected.
        assert (await _cancel(engine, asleep))[1] is Cancelled.REFUSED
        (after,) = await submit(engine, "test.record")
        await eventually(lambda: all_in(engine, [after], "completed"), 30, "a later job")
    finally:
        assert worker.stop(60) == 0


async def test_a_cancel_racing_the_end_of_its_handler_leaves_exactly_one_outcome(
    database_url, engine, tmp_path
):
    """200 jobs (async and plain handlers of 0.3 s), each cancelled at about the moment its
    handler ends: each job ends completed (with its result) or cancelled (its handler
    stopped, or finished but not yet recorded), once, and none is lost."""
    seconds = 0.3
    worker = start_worker(database_url, tmp_path, WORKER_PROCESSES="2", WORKERS="25")
    rng = random.Random(11)
    try:
        await until(lambda: len(worker.child_pids()) == 2, 90, "two worker processes")
        new = [
            NewJob(new_id(), "test.race" if i % 2 else "test.race_sync", {"seconds": seconds}, 1)
            for i in range(200)
        ]
        ids = [job.id for job in await submit_jobs(engine, new)]
        answers: dict[UUID, Cancelled] = {}

        async def cancel_at(job_id: UUID, when: float) -> None:
            await asyncio.sleep(max(0.0, when - time.time()))
            answers[job_id] = (await _cancel(engine, job_id))[1]

        scheduled: dict[str, asyncio.Task[None]] = {}
        deadline = time.monotonic() + 120
        while len(scheduled) < len(ids):
            assert time.monotonic() < deadline, f"{len(scheduled)} of {len(ids)} jobs started"
            for job_id, _, started in read_times(worker.exec_log):
                if job_id not in scheduled:
                    # Around the end of the handler, a little before more often than after:
                    # the request itself takes a few milliseconds to arrive.
                    when = started + seconds + rng.uniform(-0.12, 0.04)
                    scheduled[job_id] = asyncio.create_task(cancel_at(UUID(job_id), when))
            await asyncio.sleep(0.01)
        await asyncio.gather(*scheduled.values())

        async def all_ended() -> bool:
            found = await fetch(engine, ids)
            return all(job.status in ("completed", "cancelled") for job in found.values())

        await eventually(all_ended, 60, "every job completed or cancelled")
        found = await fetch(engine, ids)
        events: dict[str, list[str]] = {str(job_id): [] for job_id in ids}
        for event, job_id, _, _ in read_log(worker.exec_log):
            events[job_id].append(event)
        starts = [job_id for job_id, _, _ in read_times(worker.exec_log)]
        assert sorted(starts) == sorted(str(job_id) for job_id in ids)  # each ran once

        outcomes = {"completed": 0, "cancelled": 0}
        for job_id, job in found.items():
            outcomes[job.status] += 1
            assert job.attempts == 1, job
            ran = events[str(job_id)]
            if job.status == "completed":
                assert ran == ["done"], (job, ran)
                kind = "async" if job.type == "test.race" else "sync"
                assert job.result == {"job": str(job_id), "kind": kind}
                assert job.finished_at is not None
            else:
                # Stopped, or it had finished when the cancel overtook its outcome.
                assert ran in (["stopped"], ["done"]), (job, ran)
                assert answers[job_id] is Cancelled.REQUESTED
                assert job.result is None
                assert job.finished_at is not None and job.cancel_requested_at is not None
                assert job.finished_at - job.cancel_requested_at < _SECOND, job
        assert outcomes["completed"] and outcomes["cancelled"], outcomes  # the race was run
        assert _counter(worker, "jobs_cancelled_total") == outcomes["cancelled"]
        assert _counter(worker, "jobs_completed_total") == outcomes["completed"]
    finally:
        assert worker.stop(60) == 0


async def test_a_job_whose_holder_died_after_a_cancel_request_is_recovered_cancelled(
    database_url, engine, tmp_path
):
    worker = start_worker(
        database_url, tmp_path, LEASE_DURATION="3s", RECOVERY_INTERVAL="0.5s", JOB_TIMEOUT="5m"
    )
    try:
        (job_id,) = await submit(engine, "test.block", {"block_attempts": 5})
        (run,) = await until(
            lambda: [r for r in read_log(worker.exec_log) if r[1] == str(job_id)], 60, "the run"
        )
        os.kill(run[3], signal.SIGKILL)  # nobody holds the job now, nobody hears the request
        job, what = await _cancel(engine, job_id)
        assert what is Cancelled.REQUESTED and job.status == "processing"

        await eventually(lambda: all_in(engine, [job_id], "cancelled"), 60, "recovered")
        ended = (await fetch(engine, [job_id]))[job_id]
        assert ended.attempts == 1 and ended.finished_at is not None
        assert ended.last_error == "lease expired during attempt 1"
        # It never ran again, though the restarted process was free to claim it.
        assert [r[0] for r in read_log(worker.exec_log) if r[1] == str(job_id)] == ["run"]
        (recovered,) = worker.messages("job recovered")
        assert (recovered["job_id"], recovered["status"]) == (str(job_id), "cancelled")
        assert _counter(worker, "jobs_cancelled_total") == 1
        assert _counter(worker, "jobs_recovered_total") == 1
    finally:
        assert worker.stop(60) == 0


async def _terminate_listeners(engine: AsyncEngine) -> int:
    async with engine.begin() as conn:
        ended = await conn.execute(
            sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                f" WHERE application_name = '{session_name('jobqueue-worker-listen')}'"
                " AND datname = current_database()"
            )
        )
        return len(ended.all())


async def test_a_cancel_sent_while_the_listening_connection_is_cut_still_ends_the_job_at_once(
    database_url, engine, tmp_path
):
    """The listener hears of its connection's end at once, listens again, and has the
    heartbeat re-read the cancel requests of the running jobs: a request whose
    notification nobody heard is not left to the next heartbeat (LEASE_DURATION / 3)."""
    worker = start_worker(database_url, tmp_path, JOB_TIMEOUT="5m", LEASE_DURATION="60s")
    try:
        (polling,) = await submit(engine, "test.stoppable", {"seconds": 60})
        await until(lambda: _events(worker, polling) == ["run"], 60, "the handler running")
        listening = len(worker.messages("listening for wake-ups"))
        assert await _terminate_listeners(engine) == 1
        _, what = await _cancel(engine, polling)
        assert what is Cancelled.REQUESTED
        requested = time.monotonic()
        await eventually(
            lambda: all_in(engine, [polling], "cancelled"), 10, "the job cancelled", interval=0.01
        )
        took = time.monotonic() - requested
        await until(
            lambda: len(worker.messages("listening for wake-ups")) > listening, 10, "listening"
        )
        # And wake-ups are heard again: a job submitted now starts without a poll's wait.
        (after,) = await submit(engine, "test.record")
        await eventually(lambda: all_in(engine, [after], "completed"), 30, "a later job")
    finally:
        assert worker.stop(60) == 0
    assert took < 2.0, took
