"""The recovery loop on the real PostgreSQL: expired leases come back, counted and logged."""

from __future__ import annotations

import asyncio
import logging

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from jobcore import compiled, queries
from jobcore.schema import jobs
from jobcore.states import Status
from jobqueue_worker.database import PgJobStore
from jobqueue_worker.recovery import Recovery
from tests.pg import driver
from tests.worker.support import eventually, fetch, submit


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_expired_leases_go_back_to_pending_or_dead_letter_counted_and_logged(engine, caplog):
    again = (await submit(engine, "sleep", {"duration": "0s"}, max_attempts=3))[0]
    last = (await submit(engine, "sleep", {"duration": "0s"}, max_attempts=1))[0]
    async with engine.begin() as conn:
        raw = await driver(conn)
        assert len(await compiled.claim(raw, {"default": 2}, 0.05)) == 2
    recovered_before = _sample("jobs_recovered_total")
    dead_before = _sample("jobs_failed_total", status="dead_letter")

    pg = PgJobStore(engine)
    try:
        with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
            # The leases run out 50 ms after the claim, by the database's clock.
            await eventually(lambda: Recovery(pg, 60).run_once(), 10, "the expired leases")
    finally:
        await pg.close()

    found = await fetch(engine, [again, last])
    assert found[again].status == Status.PENDING and found[again].attempts == 1
    assert found[last].status == Status.DEAD_LETTER
    assert _sample("jobs_recovered_total") == recovered_before + 2
    assert _sample("jobs_failed_total", status="dead_letter") == dead_before + 1
    logged = {r.job_id for r in caplog.records if r.getMessage() == "job recovered"}  # type: ignore[attr-defined]
    assert logged == {str(again), str(last)}


async def test_recovery_runs_at_start_and_stops_when_told(engine):
    (job,) = await submit(engine, "sleep", {"duration": "0s"})
    async with engine.begin() as conn:
        raw = await driver(conn)
        await compiled.claim(raw, {"default": 1}, 0.01)
    await eventually(lambda: _expired(engine, job), 10, "the 10 ms lease to run out")
    stopped = asyncio.Event()
    pg = PgJobStore(engine)
    loop = asyncio.create_task(Recovery(pg, 3600).run(stopped))
    await eventually(lambda: _status(engine, job, Status.PENDING), 10, "recovery on the first pass")
    stopped.set()
    await asyncio.wait_for(loop, 5)
    await pg.close()


async def _status(engine, job, status) -> bool:
    return (await fetch(engine, [job]))[job].status == status


async def _expired(engine, job) -> bool:
    async with engine.connect() as conn:
        return bool(
            await conn.scalar(
                sa.select(jobs.c.locked_until < sa.func.now()).where(jobs.c.id == job)
            )
        )


async def test_recovery_takes_back_more_expired_leases_than_one_statement_holds(engine):
    count = queries.RECOVER_BATCH * 2 + 500
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO jobqueue.jobs (id, type, payload, status, attempts, max_attempts,"
                " locked_until) SELECT gen_random_uuid(), 'sleep', '{}', 'processing', 1, 3,"
                f" now() - interval '1 second' FROM generate_series(1, {count})"
            )
        )
    pg = PgJobStore(engine)
    try:
        assert await Recovery(pg, 60).run_once() == count
    finally:
        await pg.close()
    async with engine.connect() as conn:
        statuses = (await conn.execute(sa.select(jobs.c.status).distinct())).scalars().all()
    assert statuses == ["pending"]


async def test_a_failing_round_is_retried_soon_not_after_the_interval(engine):
    """A database failure does not cost a whole RECOVERY_INTERVAL: the loop retries with
    backoff, and once the database answers it takes the lease back."""
    (job,) = await submit(engine, "sleep", {"duration": "0s"})
    async with engine.begin() as conn:
        await compiled.claim(await driver(conn), {"default": 1}, 0.01)
    await eventually(lambda: _expired(engine, job), 10, "the 10 ms lease to run out")

    class Flaky:
        calls = 0

        async def recover_expired(self):
            Flaky.calls += 1
            if Flaky.calls <= 2:
                raise ConnectionError("refused")
            return await pg.recover_expired()

    pg = PgJobStore(engine)
    stopped = asyncio.Event()
    loop = asyncio.create_task(Recovery(Flaky(), 3600).run(stopped))  # type: ignore[arg-type]
    try:
        await eventually(lambda: _status(engine, job, Status.PENDING), 10, "the retried round")
    finally:
        stopped.set()
        await asyncio.wait_for(loop, 5)
        await pg.close()
    assert Flaky.calls == 3


@pytest.mark.parametrize("interval", [0.01, 0.2, 3600.0])
def test_any_positive_recovery_interval_makes_a_loop(interval):
    assert Recovery(None, interval).interval == interval  # type: ignore[arg-type]
