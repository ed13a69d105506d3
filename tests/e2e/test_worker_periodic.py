"""Periodic jobs with three real worker services of two processes each: one job per tick
whoever submits it, each run once, and no replay of the ticks that passed while no worker
ran. The schedule ticks every 2 s (tests/e2e/periodic_schedules.py); about 30 s."""

from __future__ import annotations

import collections
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore.schema import jobs
from tests.e2e.periodic_schedules import NAME, PERIOD_SECONDS
from tests.worker.support import Worker, eventually, fetch, read_log, start_worker, until

pytestmark = pytest.mark.e2e

HANDLERS = "tests.worker.handlers,tests.e2e.periodic_schedules"
PREFIX = f"periodic:{NAME}:"
PERIOD = timedelta(seconds=PERIOD_SECONDS)


def tick_of(key: str) -> datetime:
    tick = key.removeprefix(PREFIX)[:20]  # whatever may follow, so duplicates still count
    return datetime.strptime(tick, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def logged_at(line: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(line["time"].replace("Z", "+00:00"))


async def periodic_jobs(engine: AsyncEngine) -> dict[datetime, list[UUID]]:
    """The schedule's jobs, by tick."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.select(jobs.c.idempotency_key, jobs.c.id).where(
                jobs.c.idempotency_key.startswith(PREFIX)
            )
        )
        found = collections.defaultdict(list)
        for key, job_id in rows:
            found[tick_of(key)].append(job_id)
        return found


def attempts(workers: list[Worker]) -> dict[str, list[tuple[int, int, str]]]:
    """Per tick, the (service, process, outcome) of every process that submitted it."""
    found = collections.defaultdict(list)
    for service, worker in enumerate(workers):
        for line in worker.logs():
            if line.get("msg") in ("periodic job submitted", "periodic job already submitted"):
                found[line["tick"]].append((service, line["worker_process"], line["msg"]))
    return found


def started(worker: Worker) -> datetime:
    return max(logged_at(line) for line in worker.messages("worker process started"))


async def test_three_services_create_one_job_per_tick_and_a_late_worker_replays_nothing(
    database_url, engine, tmp_path
):
    executions = tmp_path / "executions.log"

    def worker(name: str, processes: int) -> Worker:
        home = tmp_path / name
        home.mkdir()
        return start_worker(
            database_url,
            home,
            WORKER_PROCESSES=str(processes),
            JOB_HANDLERS=HANDLERS,
            WORKER_TEST_LOG=str(executions),
            # The processes that lost a tick's race say so at debug level.
            LOG_LEVEL="debug",
        )

    fleet = []
    late = None
    try:
        fleet = [worker(f"worker-{i}", 2) for i in range(3)]
        await until(lambda: sum(len(w.child_pids()) for w in fleet) == 6, 120, "six processes")
        all_running = max(started(w) for w in fleet)

        async def fleet_ticks() -> bool:
            return sum(t > all_running for t in await periodic_jobs(engine)) >= 4

        await eventually(fleet_ticks, 60, "four ticks with the six processes running")
        stopping = datetime.now(UTC)
        assert [w.stop(60) for w in fleet] == [0, 0, 0]
        stopped = datetime.now(UTC)

        # Two ticks or more pass while no worker runs, well within the 60 s grace.
        await until(lambda: datetime.now(UTC) > stopped + 2 * PERIOD, 30, "two idle ticks")
        restarting = datetime.now(UTC)
        late = worker("late", 1)
        await until(late.child_pids, 60, "the late worker's process")

        async def late_ticks() -> bool:
            return sum(t > restarting for t in await periodic_jobs(engine)) >= 2

        await eventually(late_ticks, 60, "two ticks submitted by the late worker")
        cutoff = datetime.now(UTC) - PERIOD

        async def ran_until_cutoff() -> bool:
            due = [i for t, ids in (await periodic_jobs(engine)).items() if t < cutoff for i in ids]
            return all(job.status == "completed" for job in (await fetch(engine, due)).values())

        await eventually(ran_until_cutoff, 30, "the jobs of every tick so far completed")
    finally:
        codes = [w.stop(60) for w in fleet if w.proc.poll() is None]
        if late is not None:
            codes.append(late.stop(60))
    assert set(codes) <= {0}

    ticks = await periodic_jobs(engine)
    assert all(len(ids) == 1 for ids in ticks.values()), ticks
    # With the fleet running: every tick has its job, none missing (keys are unique, so
    # one job per tick is the same as one key per tick).
    window = sorted(t for t in ticks if all_running < t < stopping)
    assert len(window) >= 4
    assert all(b - a == PERIOD for a, b in itertools.pairwise(window))
    # Each was submitted by all six processes, and created by exactly one of them.
    tried = attempts(fleet)
    for tick in window:
        outcomes = tried[f"{tick:%Y-%m-%dT%H:%M:%SZ}"]
        assert [o for *_, o in outcomes].count("periodic job submitted") == 1, outcomes
    everyone = {(s, p) for t in window for s, p, _ in tried[f"{t:%Y-%m-%dT%H:%M:%SZ}"]}
    assert everyone == {(s, p) for s in range(3) for p in range(2)}

    # Nothing for the ticks that passed while no worker ran; the late worker starts after.
    assert not [t for t in ticks if stopped < t <= restarting]
    first_late = min(t for t in ticks if t > stopped)
    assert first_late - max(window) >= 3 * PERIOD

    # Every job ran once.
    runs = collections.Counter(
        job_id for event, job_id, _, _ in read_log(executions) if event == "run"
    )
    assert max(runs.values()) == 1
    assert {str(i) for t, ids in ticks.items() if t < cutoff for i in ids} <= set(runs)
