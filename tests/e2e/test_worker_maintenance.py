"""Maintenance with real worker services: the queue gauges come from exactly one of them and
move to another when it stops; retention deletes finished jobs past their age."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from jobcore import compiled
from jobcore.ids import new_id
from jobcore.rows import NewJob
from jobcore.schema import jobs
from jobcore.states import Operation
from tests.pg import driver
from tests.worker.support import (
    Worker,
    all_in,
    count_by_status,
    eventually,
    start_worker,
    submit,
    submit_jobs,
    until,
)

pytestmark = pytest.mark.e2e

Gauges = dict[tuple[str, ...], float]


def queue_gauges(worker: Worker) -> Gauges | None:
    """The queue-gauge series a worker service exports (None while it does not answer)."""
    try:
        response = worker.get("/metrics")
    except Exception:
        return None
    found: Gauges = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            if s.name == "jobs_queued":
                found[(s.name, s.labels["queue"], s.labels["status"])] = s.value
            elif s.name == "jobs_oldest_pending_age_seconds":
                found[(s.name, s.labels["queue"])] = s.value
    return found


def depths(gauges: Gauges) -> Gauges:
    """The counts, without the ages (which grow)."""
    return {key: value for key, value in gauges.items() if key[0] == "jobs_queued"}


def expected(**queues: tuple[int, int, int, int]) -> Gauges:
    statuses = ("pending", "scheduled", "processing", "dead_letter")
    return {
        ("jobs_queued", queue, status): n
        for queue, counts in queues.items()
        for status, n in zip(statuses, counts, strict=True)
    }


async def test_exactly_one_worker_service_exports_the_queue_gauges_and_another_takes_over(
    database_url, engine, tmp_path
):
    # Jobs of queues no worker serves (QUEUES=default) keep their statuses: 3 due, 2 scheduled,
    # 1 processing and 1 dead letter in "reports"; 2 due in "gone".
    async with engine.begin() as conn:
        raw = await driver(conn)
        await submit_jobs(engine, [NewJob(new_id(), "sleep", {}, 1, queue="reports")])
        (dead,) = await compiled.claim(raw, {"reports": 1}, 3600)
        await compiled.record(raw, Operation.DEAD_LETTER, [dead.lease], ["gave up"])
        await submit_jobs(engine, [NewJob(new_id(), "sleep", {}, 3, queue="reports")])
        await compiled.claim(raw, {"reports": 1}, 3600)
    await submit_jobs(
        engine,
        [NewJob(new_id(), "sleep", {}, 3, queue="reports") for _ in range(3)]
        + [NewJob(new_id(), "sleep", {}, 3, queue="reports", delay=3600) for _ in range(2)]
        + [NewJob(new_id(), "sleep", {}, 3, queue="gone") for _ in range(2)],
    )
    want = expected(reports=(3, 2, 1, 1), gone=(2, 0, 0, 0))

    workers = [start_worker(database_url, tmp_path, WORKER_PROCESSES="2") for _ in range(2)]
    try:

        def one_leader() -> Worker | None:
            seen = [queue_gauges(w) for w in workers]
            if any(gauges is None for gauges in seen):
                return None
            leaders = [w for w, gauges in zip(workers, seen, strict=True) if gauges]
            if len(leaders) == 1 and depths(seen[workers.index(leaders[0])] or {}) == want:
                return leaders[0]
            return None

        leader = await until(one_leader, 90, "one worker service exporting the gauges")
        follower = workers[1 - workers.index(leader)]
        # And it stays so over several refreshes: the other never exports any.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            assert queue_gauges(follower) == {}
            gauges = queue_gauges(leader)
            assert gauges is not None and depths(gauges) == want
            await asyncio.sleep(0.5)
        assert 0 <= gauges[("jobs_oldest_pending_age_seconds", "reports")] < 120
        assert gauges[("jobs_oldest_pending_age_seconds", "gone")] >= 0

        # A queue that empties is no longer reported.
        async with engine.begin() as conn:
            await conn.execute(sa.delete(jobs).where(jobs.c.queue == "gone"))
        want = expected(reports=(3, 2, 1, 1))
        await until(
            lambda: depths(queue_gauges(leader) or {}) == want, 30, "the gone queue to vanish"
        )

        # The leader stops: it resigns, and the other service takes over at its next refresh
        # (every 2 s), well before the leader's lease (6 s) would have run out.
        await until(lambda: len(follower.child_pids()) == 2, 60, "the other's processes")
        stopped_at = time.monotonic()
        leader.signal(signal.SIGTERM)
        await until(
            lambda: depths(queue_gauges(follower) or {}) == want, 30, "the other service to lead"
        )
        assert time.monotonic() - stopped_at < 5
        assert leader.wait(60) == 0
        taken = [line for line in follower.messages("maintenance lead taken")]
        assert any(line["task"] == "queue_gauges" for line in taken)
        given_up = leader.messages("maintenance lead given up")
        assert any(line["task"] == "queue_gauges" and line["resigned"] for line in given_up)
    finally:
        for worker in workers:
            if worker.proc.poll() is None:
                assert worker.stop(60) == 0


async def test_a_leader_that_dies_is_replaced_once_its_lease_runs_out(
    database_url, engine, tmp_path
):
    await submit_jobs(engine, [NewJob(new_id(), "sleep", {}, 3, queue="reports")])
    want = expected(reports=(1, 0, 0, 0))
    worker = start_worker(database_url, tmp_path, WORKER_PROCESSES="2")
    try:
        await until(lambda: depths(queue_gauges(worker) or {}) == want, 90, "the gauges")
        (taken,) = [
            line
            for line in worker.messages("maintenance lead taken")
            if line["task"] == "queue_gauges"
        ]
        (started,) = [
            line
            for line in worker.messages("worker process started")
            if line["worker_process"] == taken["worker_process"]
        ]
        killed_at = time.monotonic()
        os.kill(started["pid"], signal.SIGKILL)

        def new_leader() -> list[dict[str, Any]]:
            return [
                line
                for line in worker.messages("maintenance lead taken")
                if line["task"] == "queue_gauges" and line["holder"] != taken["holder"]
            ]

        # The other process (or the dead one's replacement) takes the lead once the dead
        # one's 6 s lease has run out; the dead one's values went with it.
        await until(new_leader, 30, "another process to lead")
        assert time.monotonic() - killed_at < 15
        await until(lambda: depths(queue_gauges(worker) or {}) == want, 10, "the gauges again")
    finally:
        assert worker.stop(60) == 0


async def test_retention_deletes_finished_jobs_past_their_age_and_keeps_the_rest(
    database_url, engine, tmp_path
):
    retention = {"RETENTION_COMPLETED": "1s", "RETENTION_FAILED": "0"}
    completed = await submit(engine, "test.record", count=20)
    failed = await submit(engine, "test.permanent", count=2)
    first = start_worker(database_url, tmp_path, **retention)
    try:
        await eventually(lambda: all_in(engine, completed, "completed"), 60, "20 completed")
        await eventually(lambda: all_in(engine, failed, "failed"), 60, "2 failed")
    finally:
        # It led retention since it started (and found nothing old enough): it resigns.
        assert first.stop(60) == 0
    assert any(line["task"] == "retention" for line in first.messages("maintenance lead taken"))

    async def old_enough() -> bool:
        async with engine.connect() as conn:
            return bool(
                await conn.scalar(
                    sa.select(
                        sa.func.max(jobs.c.finished_at)
                        < sa.func.now() - sa.text("interval '1 second'")
                    )
                )
            )

    await eventually(old_enough, 10, "every job finished more than 1 s ago")
    second = start_worker(database_url, tmp_path, **retention)
    try:
        # Its first run, at start, prunes them.
        await eventually(
            lambda: _statuses_are(engine, {"failed": 2}), 60, "the completed jobs deleted"
        )
        (line,) = await until(lambda: second.messages("jobs pruned"), 30, "the run's log line")
        assert line["pruned"] == {"completed": 20} and line["total"] == 20
        response = second.get("/metrics")
        pruned = _samples(response.text, "jobs_pruned_total")
        assert pruned == {"completed": 20, "failed": 0, "cancelled": 0, "dead_letter": 0}
    finally:
        assert second.stop(60) == 0


async def _statuses_are(engine, want: dict[str, int]) -> bool:
    return await count_by_status(engine) == want


def _samples(text: str, name: str) -> dict[str, Any]:
    return {
        s.labels["status"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


@pytest.mark.parametrize(
    "variable", ["RETENTION_COMPLETED", "RETENTION_FAILED", "RETENTION_DEAD_LETTER"]
)
def test_a_bad_retention_stops_the_worker_with_one_line_naming_it(database_url, tmp_path, variable):
    worker = start_worker(database_url, tmp_path, **{variable: "a week"})
    assert worker.wait(60) == 2
    (line,) = worker.logs()
    assert line["level"] == "error" and line["variable"] == variable
