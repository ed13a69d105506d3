"""Concurrency keys with real worker processes: keys take turns (a late key is not stuck
behind another key's backlog), KEY_CONCURRENCY holds across every worker service of the
database, through a crash and the recovery of the jobs it held, and a paused queue's keyed
jobs wait for its resumption."""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import pauses
from jobcore.db import make_engine
from jobcore.ids import new_id
from jobcore.rows import NewJob
from jobcore.schema import jobs
from tests.worker.support import (
    all_in,
    eventually,
    most_at_once,
    read_times,
    start_worker,
    submit_jobs,
    until,
)

pytestmark = pytest.mark.e2e

# Short leases so the jobs a killed service held come back within seconds.
FAST_RECOVERY = {"JOB_TIMEOUT": "1s", "LEASE_DURATION": "3s", "RECOVERY_INTERVAL": "0.5s"}

# A backlog of one key in one statement: submitting 10,000 jobs one by one takes longer
# than the test may.
FILL = sa.text(
    """
    INSERT INTO jobqueue.jobs (id, type, payload, max_attempts, concurrency_key)
    SELECT gen_random_uuid(), 'test.stamp', CAST(:payload AS jsonb), 3, :key
    FROM generate_series(1, :count)
    """
)

RUNNING_BY_KEY = sa.text(
    "SELECT concurrency_key, count(*) FROM jobqueue.jobs WHERE status = 'processing' GROUP BY 1"
)


def keyed(type: str, payload: Any, key: str | None, queue: str = "default") -> NewJob:
    return NewJob(new_id(), type, payload, 3, queue=queue, concurrency_key=key)


async def _pending_of_key(engine: AsyncEngine, key: str) -> int:
    async with engine.connect() as conn:
        found = await conn.scalar(
            sa.select(sa.func.count())
            .select_from(jobs)
            .where(jobs.c.concurrency_key == key, jobs.c.status == "pending")
        )
    return int(found or 0)


async def test_a_key_submitted_behind_another_keys_backlog_starts_within_two_seconds(
    database_url, engine, tmp_path
):
    async with engine.begin() as conn:
        await conn.execute(FILL, {"payload": '{"seconds": 0.05}', "key": "A", "count": 10_000})
    backlog_at = time.time()
    worker = start_worker(database_url, tmp_path, WORKERS="16", QUEUES="default:16")
    try:
        await until(lambda: read_times(worker.exec_log), 30, "the backlog running")
        await asyncio.sleep(max(0.0, backlog_at + 1.0 - time.time()))
        submitted = time.time()
        late = [
            job.id
            for job in await submit_jobs(
                engine, [keyed("test.stamp", {"seconds": 0.05}, "B") for _ in range(20)]
            )
        ]
        await eventually(lambda: all_in(engine, late, "completed"), 20, "key B's jobs", 0.05)
        # Read after the last B job started: A had at least this many pending then.
        pending_a = await _pending_of_key(engine, "A")
    finally:
        assert worker.stop(60) == 0
    started = {job_id: at for job_id, _, at in read_times(worker.exec_log)}
    waits = sorted(started[str(job_id)] - submitted for job_id in late)
    assert waits[-1] < 2.0, waits
    assert pending_a >= 9_000, pending_a
    # A was running all along: B did not wait for an idle worker.
    assert sum(1 for at in started.values() if at < submitted) >= 16


class RunningSampler:
    """Polls the jobs processing per key in the database, as fast as it can, until stopped:
    the most seen at once per key."""

    def __init__(self, database_url: str) -> None:
        self.engine = make_engine(database_url, pool_size=1, isolation_level="AUTOCOMMIT")
        self.most: Counter[str | None] = Counter()
        self.samples = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async with self.engine.connect() as conn:
            while not self._stop.is_set():
                for key, n in (await conn.execute(RUNNING_BY_KEY)).all():
                    self.most[key] = max(self.most[key], n)
                self.samples += 1
                await asyncio.sleep(0.005)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
        await self.engine.dispose()


class Run:
    """One run of a `test.interval` handler: its process and when it started and ended
    (None: killed before it ended)."""

    def __init__(self, attempt: int, pid: int, start: float) -> None:
        self.attempt, self.pid, self.start = attempt, pid, start
        self.end: float | None = None


def read_runs(exec_log: Path) -> dict[str, list[Run]]:
    """Per job id, the runs `test.interval` recorded, by attempt."""
    path = Path(str(exec_log) + ".intervals")
    runs: dict[tuple[str, int, int], Run] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            event, job_id, attempt, pid, at = line.split()
            place = (job_id, int(attempt), int(pid))
            if event == "start":
                runs[place] = Run(int(attempt), int(pid), float(at))
            else:
                runs[place].end = float(at)
    by_job: dict[str, list[Run]] = defaultdict(list)
    for (job_id, _, _), run in runs.items():
        by_job[job_id].append(run)
    return {job_id: sorted(found, key=lambda r: r.attempt) for job_id, found in by_job.items()}


async def test_key_concurrency_holds_across_three_services_through_a_killed_service(
    database_url, engine, tmp_path
):
    workers = [
        start_worker(
            database_url,
            tmp_path,
            WORKER_PROCESSES="2",
            KEY_CONCURRENCY="*:2",
            **FAST_RECOVERY,
        )
        for _ in range(3)
    ]
    victim = workers[1]
    sampler = RunningSampler(database_url)
    try:
        await until(
            lambda: all(len(w.child_pids()) == 2 for w in workers), 60, "every worker process"
        )
        sampler.start()
        keys = [f"k{n}" for n in range(10)]
        submitted = await submit_jobs(
            engine,
            [keyed("test.interval", {"seconds": 0.3}, key) for _ in range(20) for key in keys],
        )
        ids = [job.id for job in submitted]
        key_of = {str(job.id): job.concurrency_key for job in submitted}
        victim_pids = set(victim.child_pids())

        def victim_busy() -> bool:
            runs = [r for found in read_runs(victim.exec_log).values() for r in found]
            ended = sum(1 for r in runs if r.end is not None)
            return ended >= 40 and any(r.pid in victim_pids and r.end is None for r in runs)

        await until(victim_busy, 30, "the victim service in the middle of its jobs")
        victim.kill()
        killed_at = time.time()
        await eventually(lambda: all_in(engine, ids, "completed"), 60, "every job", 0.2)
    finally:
        await sampler.stop()
        for worker in workers:
            if worker is not victim:
                assert worker.stop(60) == 0
            else:
                worker.kill()

    # The database never had more than 2 of a key processing, and did have 2 at once.
    assert sampler.samples > 100, sampler.samples
    assert set(sampler.most) <= set(keys)
    assert max(sampler.most.values()) == 2, sampler.most

    runs = read_runs(victim.exec_log)
    assert set(runs) == {str(i) for i in ids}
    rerun = 0
    for job_id, found in runs.items():
        # A run before the last is allowed only if its holder was killed.
        assert all(r.pid in victim_pids for r in found[:-1]), (job_id, found)
        assert found[-1].end is not None, (job_id, found)
        assert len(found) == 1 or found[-1].pid not in victim_pids, (job_id, found)
        rerun += len(found) > 1
    assert rerun >= 1  # the kill hit jobs mid-run, and they ran again
    async with engine.connect() as conn:
        rows = await conn.execute(sa.select(jobs.c.id, jobs.c.attempts).where(jobs.c.id.in_(ids)))
        attempts = {str(id): n for id, n in rows}
    # Every claim of a job ran its handler: its attempts are its runs'.
    assert attempts == {job_id: found[-1].attempt for job_id, found in runs.items()}

    # The handlers agree: per key, never more than 2 runs overlapped (a killed run lasted
    # until the kill), recovered runs included.
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for job_id, found in runs.items():
        for r in found:
            spans[key_of[job_id] or ""].append((r.start, killed_at if r.end is None else r.end))
    overlaps = {key: most_at_once(found) for key, found in spans.items()}
    assert max(overlaps.values()) == 2, overlaps


async def _statuses(engine: AsyncEngine, ids: list[UUID]) -> Counter[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(sa.select(jobs.c.status).where(jobs.c.id.in_(ids)))
        return Counter(status for (status,) in rows)


async def test_a_paused_queue_claims_none_of_its_keyed_jobs_until_resumed(
    database_url, engine, tmp_path
):
    auto = make_engine(database_url, pool_size=1, isolation_level="AUTOCOMMIT")
    async with auto.connect() as conn:
        await pauses.pause(conn, "default")
    worker = start_worker(database_url, tmp_path, QUEUES="default:4,other:4", KEY_CONCURRENCY="*:1")
    try:
        await until(lambda: worker.child_pids(), 60, "the worker process")
        submitted = await submit_jobs(
            engine,
            [keyed("test.interval", {"seconds": 0.1}, key) for key in ("x", "y", None) * 3],
        )
        held = [job.id for job in submitted]
        others = [
            job.id
            for job in await submit_jobs(
                engine, [keyed("test.record", {}, key, "other") for key in ("x", "y") * 3]
            )
        ]
        # The worker claims: from the other queue, with the same keys.
        await eventually(lambda: all_in(engine, others, "completed"), 30, "the other queue")
        window = time.monotonic() + 1.5
        while time.monotonic() < window:
            assert await _statuses(engine, held) == {"pending": len(held)}
            await asyncio.sleep(0.1)
        async with auto.connect() as conn:
            assert await pauses.resume(conn, "default")
        await eventually(lambda: all_in(engine, held, "completed"), 30, "the resumed queue")
    finally:
        await auto.dispose()
        assert worker.stop(60) == 0
    # Resumed, its keys still run one at a time (KEY_CONCURRENCY=*:1).
    runs = read_runs(worker.exec_log)
    for key in ("x", "y"):
        spans = [
            (r.start, r.end)
            for job in submitted
            if job.concurrency_key == key
            for r in runs[str(job.id)]
            if r.end is not None
        ]
        assert len(spans) == 3 and most_at_once(spans) == 1, (key, spans)


async def test_a_handler_that_outlives_its_timeout_holds_its_keys_unit_until_it_returns(
    database_url, engine, tmp_path
):
    """Plain def handlers of one key sleep 2.5 s under a 0.3 s timeout: each attempt is
    recorded (timed out) after its grace, but its thread runs on, and with it the unit of
    KEY_CONCURRENCY it holds: the key's next job waits until it returns."""
    from tests.limits.test_limits_e2e import _spans, _spans_at_least

    keyed = [
        NewJob(new_id(), "test.overrun", {"seconds": 2.5}, 1, concurrency_key="tenant-1")
        for _ in range(3)
    ]
    ids = [job.id for job in await submit_jobs(engine, keyed)]
    worker = start_worker(
        database_url, tmp_path, WORKERS="4", JOB_TIMEOUT="0.3s", KEY_CONCURRENCY="*:1"
    )
    try:
        await eventually(lambda: all_in(engine, ids, "dead_letter"), 40, "every attempt ended")
        await eventually(_spans_at_least(worker.exec_log, 3), 20, "every handler returned")
    finally:
        assert worker.stop() == 0
    assert most_at_once(_spans(worker.exec_log)) == 1
