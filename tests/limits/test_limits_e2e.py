"""TYPE_CONCURRENCY and TYPE_RATE across real worker services, each with several processes:
the database is the only thing they share."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from jobcore.ids import new_id
from jobcore.rows import NewJob
from tests.worker.support import (
    all_in,
    eventually,
    most_at_once,
    read_times,
    start_worker,
    submit,
    submit_jobs,
)

pytestmark = pytest.mark.e2e


def _spans(exec_log: Path) -> list[tuple[float, float]]:
    path = Path(str(exec_log) + ".spans")
    if not path.exists():
        return []
    return [
        (float(start), float(end))
        for _, _, start, end in (line.split() for line in path.read_text().splitlines())
    ]


def _spans_at_least(exec_log: Path, n: int) -> Callable[[], Awaitable[bool]]:
    async def enough() -> bool:
        return len(_spans(exec_log)) >= n

    return enough


async def test_three_worker_services_never_run_more_jobs_of_a_type_than_its_concurrency(
    database_url, engine, tmp_path
):
    limited = await submit(engine, "test.span", {"seconds": 0.5}, count=36)
    others = await submit(engine, "test.record", count=24)
    workers = [
        start_worker(
            database_url,
            tmp_path,
            WORKER_PROCESSES="2",
            WORKERS="4",
            POLL_INTERVAL="1s",
            TYPE_CONCURRENCY="test.span:2",
        )
        for _ in range(3)
    ]
    try:
        # Other types are never held back behind the limited one: they finish long before it.
        await eventually(lambda: all_in(engine, others, "completed"), 30, "the other jobs")
        assert not await all_in(engine, limited, "completed")
        await eventually(lambda: all_in(engine, limited, "completed"), 90, "the limited jobs")
    finally:
        for worker in workers:
            assert worker.stop() == 0
    spans = _spans(workers[0].exec_log)
    assert len(spans) == 36
    assert most_at_once(spans) == 2
    # 36 half-second jobs two at a time take 9 s at best; a unit of concurrency freed in one
    # process is taken again at once (by that process), not at the next poll.
    elapsed = max(end for _, end in spans) - min(start for start, _ in spans)
    assert elapsed < 9 * 1.5, elapsed


async def test_a_rate_limited_type_starts_no_more_than_its_rate_over_ten_seconds(
    database_url, engine, tmp_path
):
    await submit(engine, "test.stamp", count=200)
    workers = [
        start_worker(
            database_url,
            tmp_path,
            WORKER_PROCESSES="2",
            WORKERS="8",
            # Far longer than a window: the workers must wake when the next window opens.
            POLL_INTERVAL="5s",
            TYPE_RATE="test.stamp:10/s",
        )
        for _ in range(2)
    ]
    exec_log = workers[0].exec_log
    try:

        async def enough() -> bool:
            times = sorted(at for _, _, at in read_times(exec_log))
            return bool(times) and times[-1] - times[0] >= 10.5

        await eventually(enough, 60, "starts over more than 10 s")
    finally:
        for worker in workers:
            assert worker.stop() == 0
    times = sorted(at for _, _, at in read_times(exec_log))
    first = times[0]
    in_ten = [at for at in times if at < first + 10.0]
    # At most 10 per fixed one-second window: 10 s cover at most 11 windows.
    assert len(in_ten) <= 10 * 10 + 10, len(in_ten)
    # And the limit is used: a window opening is noticed within milliseconds, not at the poll.
    assert len(in_ten) >= 90, len(in_ten)
    for i, at in enumerate(times):
        within_a_second = sum(1 for other in times[i:] if other < at + 1.0)
        assert within_a_second <= 20  # the most two adjacent windows allow


async def test_a_handler_that_outlives_its_timeout_holds_its_unit_until_it_returns(
    database_url, engine, tmp_path
):
    """Plain def handlers sleep 2.5 s under a 0.3 s timeout: each attempt is recorded
    (timed out) after its grace, but its thread runs on, and with it the unit of
    TYPE_CONCURRENCY it holds: the next job of the type waits until it returns."""
    jobs = await submit(engine, "test.overrun", {"seconds": 2.5}, max_attempts=1, count=3)
    worker = start_worker(
        database_url,
        tmp_path,
        WORKERS="4",
        JOB_TIMEOUT="0.3s",
        TYPE_CONCURRENCY="test.overrun:1",
    )
    try:
        await eventually(lambda: all_in(engine, jobs, "dead_letter"), 40, "every attempt ended")
        await eventually(_spans_at_least(worker.exec_log, 3), 20, "every handler returned")
    finally:
        assert worker.stop() == 0
    assert most_at_once(_spans(worker.exec_log)) == 1


async def test_a_limited_backlog_does_not_hold_up_a_job_of_higher_priority(
    database_url, engine, tmp_path
):
    """80 half-second jobs of a limited type at priority -100 fill every slot for 10 s; a
    job of another type at priority 100 still starts as soon as a slot frees."""
    backlog = [NewJob(new_id(), "test.span", {"seconds": 0.5}, 3, priority=-100)]
    await submit_jobs(engine, [*backlog, *(b._replace(id=new_id()) for b in backlog * 79)])
    worker = start_worker(database_url, tmp_path, WORKERS="4", TYPE_CONCURRENCY="test.span:4")
    try:
        await eventually(_spans_at_least(worker.exec_log, 4), 20, "the backlog running")
        submitted = time.monotonic()
        (urgent,) = await submit_jobs(
            engine, [NewJob(new_id(), "test.record", {}, 3, priority=100)]
        )
        await eventually(lambda: all_in(engine, [urgent.id], "completed"), 20, "the urgent job")
        waited = time.monotonic() - submitted
        behind = len(_spans(worker.exec_log))
    finally:
        assert worker.stop() == 0
    # Before, it waited for the whole backlog (10 s); now for one slot (0.5 s) and a claim.
    assert waited < 2.5, waited
    assert behind < 40, behind
