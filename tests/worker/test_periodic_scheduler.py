"""The periodic scheduler on the real PostgreSQL: one job per tick whoever submits it,
no tick from before the process started, none later than the grace, and failures retried
within it."""

from __future__ import annotations

import asyncio
import itertools
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import store
from jobcore.db import make_engine
from jobcore.ids import new_id
from jobcore.periodic import Schedule, check_cron
from jobcore.rows import Job, NewJob
from jobcore.schema import jobs
from jobqueue_worker.periodic import GRACE, Scheduler
from tests.faultproxy import FaultProxy


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


class Clock:
    """A wall clock the test moves; in the future, so that a job's run_at (never before the
    database's now()) is the tick itself."""

    def __init__(self, text: str) -> None:
        self.now = at(text)

    def __call__(self) -> datetime:
        return self.now

    def set(self, text: str) -> None:
        self.now = at(text)


def schedule(cron: str = "*/5 * * * *", **fields: Any) -> Schedule:
    values: dict[str, Any] = {"name": "report-5m", "type": "sleep", "payload": {"duration": "0s"}}
    values.update(fields)
    return Schedule(cron=check_cron(cron), **values)


async def periodic_jobs(engine: AsyncEngine) -> dict[str, Job]:
    """Jobs with a periodic key, by key."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.select(jobs.c.id).where(jobs.c.idempotency_key.like("periodic:%"))
        )
        found = [await store.get(conn, job_id) for (job_id,) in rows]
    return {job.idempotency_key: job for job in found if job and job.idempotency_key}


def messages(caplog: pytest.LogCaptureFixture, msg: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == msg]


async def test_many_concurrent_submitters_of_one_tick_create_exactly_one_job(database_url):
    # Connections of their own, so the 24 inserts really race in the database.
    engine = make_engine(database_url, pool_size=24)
    try:
        clock = Clock("2099-01-01 10:07:00")
        schedulers = [
            Scheduler(engine, [schedule()], max_attempts=3, clock=clock) for _ in range(24)
        ]
        clock.set("2099-01-01 10:10:00.2")
        rounds = await asyncio.gather(*(s.run_once() for s in schedulers))
        found = await periodic_jobs(engine)
    finally:
        await engine.dispose()
    assert list(found) == ["periodic:report-5m:2099-01-01T10:10:00Z"]
    created = [job for jobs_created in rounds for job in jobs_created]
    assert [job.id for job in created] == [found["periodic:report-5m:2099-01-01T10:10:00Z"].id]


async def test_the_job_is_due_at_the_tick_with_the_schedules_fields(engine, caplog):
    clock = Clock("2099-01-01 10:07:00")
    timed = schedule(queue="reports", priority=7, timeout=120.0)
    scheduler = Scheduler(engine, [timed, schedule(name="plain")], max_attempts=4, clock=clock)
    clock.set("2099-01-01 10:10:00.5")
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        created = await scheduler.run_once()
    found = await periodic_jobs(engine)
    job = found["periodic:report-5m:2099-01-01T10:10:00Z"]
    assert job.run_at == at("2099-01-01 10:10:00")
    assert (job.type, job.payload, job.queue, job.priority) == (
        "sleep",
        {"duration": "0s"},
        "reports",
        7,
    )
    assert (job.timeout, job.max_attempts) == (120.0, 4)  # the worker's MAX_ATTEMPTS
    assert found["periodic:plain:2099-01-01T10:10:00Z"].queue == "default"
    assert {j.id for j in created} == {j.id for j in found.values()}
    logged = {(r.schedule, r.tick, r.job_id) for r in messages(caplog, "periodic job submitted")}  # type: ignore[attr-defined]
    assert logged == {
        ("report-5m", "2099-01-01T10:10:00Z", str(job.id)),
        ("plain", "2099-01-01T10:10:00Z", str(found["periodic:plain:2099-01-01T10:10:00Z"].id)),
    }
    # Until the next tick, 4 min 59.5 s away, capped so a stepped clock is noticed.
    assert scheduler.interval == 15.0
    clock.set("2099-01-01 10:14:59.9")
    assert await scheduler.run_once() == []
    assert scheduler.interval == pytest.approx(0.1)


async def test_ticks_before_the_process_started_are_not_submitted(engine):
    clock = Clock("2099-01-01 10:05:30")
    scheduler = Scheduler(engine, [schedule()], max_attempts=3, clock=clock)
    # 10:05 passed before it started: not submitted, though still within the grace.
    assert await scheduler.run_once() == []
    clock.set("2099-01-01 10:09:59.9")
    assert await scheduler.run_once() == []
    clock.set("2099-01-01 10:10:00")
    await scheduler.run_once()
    assert list(await periodic_jobs(engine)) == ["periodic:report-5m:2099-01-01T10:10:00Z"]


async def test_a_late_tick_is_submitted_within_the_grace_and_given_up_after(engine, caplog):
    assert GRACE == 60.0
    clock = Clock("2099-01-01 10:07:00")
    late = Scheduler(engine, [schedule(name="late")], max_attempts=3, clock=clock)
    too_late = Scheduler(engine, [schedule(name="too-late")], max_attempts=3, clock=clock)
    clock.set("2099-01-01 10:10:59")  # the event loop was blocked, or the process asleep
    assert len(await late.run_once()) == 1
    clock.set("2099-01-01 10:21:01")  # 10:10, 10:15 and 10:20 are more than 60 s old
    with caplog.at_level(logging.WARNING, logger="jobqueue.worker"):
        assert await too_late.run_once() == []
    assert list(await periodic_jobs(engine)) == ["periodic:late:2099-01-01T10:10:00Z"]
    (skipped,) = messages(caplog, "periodic ticks skipped")
    assert (skipped.schedule, skipped.first_skipped, skipped.last_skipped) == (  # type: ignore[attr-defined]
        "too-late",
        "2099-01-01T10:10:00Z",
        "2099-01-01T10:20:00Z",
    )
    clock.set("2099-01-01 10:25:00")  # and it goes on with the next tick
    assert len(await too_late.run_once()) == 1


async def test_a_failed_submission_is_retried_until_the_grace_ends(database_url, engine, caplog):
    with FaultProxy.to_database(database_url) as proxy:
        through_proxy = make_engine(proxy.database_url(database_url), connect_timeout=2.0)
        try:
            clock = Clock("2099-01-01 10:07:00")
            scheduler = Scheduler(through_proxy, [schedule()], max_attempts=3, clock=clock)
            proxy.refuse()
            clock.set("2099-01-01 10:10:00")
            with pytest.raises(OSError):
                await scheduler.run_once()
            clock.set("2099-01-01 10:10:50")
            with pytest.raises(OSError):
                await scheduler.run_once()
            proxy.pass_through()
            clock.set("2099-01-01 10:10:59")
            assert len(await scheduler.run_once()) == 1
            assert list(await periodic_jobs(engine)) == ["periodic:report-5m:2099-01-01T10:10:00Z"]

            # Down past the grace: that tick is given up, not replayed once the database is back.
            proxy.refuse()
            proxy.cut()
            clock.set("2099-01-01 10:15:00")
            with pytest.raises(Exception):  # noqa: B017 (whatever the driver makes of it)
                await scheduler.run_once()
            proxy.pass_through()
            clock.set("2099-01-01 10:16:01")
            assert await scheduler.run_once() == []
            assert len(await periodic_jobs(engine)) == 1
        finally:
            await through_proxy.dispose()


async def test_a_key_bound_to_a_different_request_is_logged_and_skipped(engine, caplog):
    async with engine.begin() as conn:
        # The schedule as an older deploy declared it, submitted by a process still running it.
        await store.submit(
            conn,
            NewJob(
                new_id(),
                "sleep",
                {"duration": "1s"},
                3,
                idempotency_key="periodic:report-5m:2099-01-01T10:10:00Z",
            ),
        )
    clock = Clock("2099-01-01 10:07:00")
    scheduler = Scheduler(engine, [schedule()], max_attempts=3, clock=clock)
    clock.set("2099-01-01 10:10:00")
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        assert await scheduler.run_once() == []
    (conflict,) = messages(caplog, "periodic job conflict")
    assert (conflict.schedule, conflict.tick) == ("report-5m", "2099-01-01T10:10:00Z")  # type: ignore[attr-defined]
    assert not messages(caplog, "periodic job submitted")
    clock.set("2099-01-01 10:15:00")
    assert len(await scheduler.run_once()) == 1  # the next tick is submitted as usual
    found = await periodic_jobs(engine)
    assert found["periodic:report-5m:2099-01-01T10:10:00Z"].payload == {"duration": "1s"}


async def test_the_process_that_lost_the_race_logs_no_submission(engine, caplog):
    clock = Clock("2099-01-01 10:07:00")
    first = Scheduler(engine, [schedule()], max_attempts=3, clock=clock)
    second = Scheduler(engine, [schedule()], max_attempts=3, clock=clock)
    clock.set("2099-01-01 10:10:00")
    assert len(await first.run_once()) == 1
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        assert await second.run_once() == []
    assert not messages(caplog, "periodic job submitted")


async def test_a_running_scheduler_submits_each_tick_on_time_and_stops_when_told(engine):
    every_second = schedule("* * * * * *", name="every-second")
    scheduler = Scheduler(engine, [every_second], max_attempts=3)
    started = datetime.now(UTC)
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler.run(stop))
    deadline = asyncio.get_running_loop().time() + 10
    while len(await periodic_jobs(engine)) < 3:
        assert asyncio.get_running_loop().time() < deadline, "three ticks within 10 s"
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 5)
    found = await periodic_jobs(engine)
    ticks = sorted(at(key.removeprefix("periodic:every-second:")[:-1]) for key in found)
    assert ticks[0] > started
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(ticks))
    for job in found.values():
        tick = at(job.idempotency_key.removeprefix("periodic:every-second:")[:-1])  # type: ignore[union-attr]
        # Submitted at the tick (run_at is the tick, or the database's now() if that is
        # already later), not a round of polling later.
        assert tick <= job.run_at < tick + timedelta(seconds=0.5)
        assert job.created_at < tick + timedelta(seconds=0.5)


async def test_a_schedule_without_a_handler_in_the_process_is_warned_about(engine, caplog):
    with caplog.at_level(logging.WARNING, logger="jobqueue.worker"):
        Scheduler(engine, [schedule(type="no.such.type")], max_attempts=3)
    (warning,) = messages(caplog, "periodic schedule has no handler in this process")
    assert (warning.schedule, warning.type) == ("report-5m", "no.such.type")  # type: ignore[attr-defined]
