"""Maintenance statements against a real PostgreSQL, through the worker's calls
(`jobcore.compiled`): one leader per task (`take_lead`, `resign`) and retention (`prune`)."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest
import sqlalchemy as sa

from jobcore import compiled, maintenance, store
from jobcore.ids import new_id
from jobcore.rows import NewJob
from jobcore.schema import jobs, maintenance_leases
from jobcore.states import FINISHED, Status
from tests.pg import driver

HOUR = 3600.0
A, B = uuid.uuid4(), uuid.uuid4()


async def _lead(engine, task: str, holder: uuid.UUID, lease: float = 30.0) -> bool:
    async with engine.connect() as conn:
        return await compiled.take_lead(await driver(conn), task, holder, lease)


async def _resign(engine, task: str, holder: uuid.UUID) -> None:
    async with engine.connect() as conn:
        await compiled.resign(await driver(conn), task, holder)


async def _expires_at(engine, task: str):
    async with engine.connect() as conn:
        return await conn.scalar(
            sa.select(maintenance_leases.c.expires_at).where(maintenance_leases.c.task == task)
        )


async def test_one_holder_leads_a_task_at_a_time_and_tasks_are_led_apart(engine):
    assert await _lead(engine, maintenance.GAUGES, A)
    assert not await _lead(engine, maintenance.GAUGES, B)
    assert await _lead(engine, maintenance.GAUGES, A)  # the leader keeps it
    assert await _lead(engine, maintenance.RETENTION, B)  # another task, another leader
    assert not await _lead(engine, maintenance.RETENTION, A)


async def test_renewing_extends_the_lease_and_keeps_the_lead(engine):
    assert await _lead(engine, maintenance.GAUGES, A, lease=1.0)
    first = await _expires_at(engine, maintenance.GAUGES)
    deadline = time.monotonic() + 2.5  # more than two leases
    while time.monotonic() < deadline:
        assert await _lead(engine, maintenance.GAUGES, A, lease=1.0)
        assert not await _lead(engine, maintenance.GAUGES, B)
        await asyncio.sleep(0.1)  # the renewal cadence
    last = await _expires_at(engine, maintenance.GAUGES)
    assert (last - first).total_seconds() >= 2.0


async def test_a_lead_not_renewed_passes_to_another_holder_once_its_lease_runs_out(engine):
    assert await _lead(engine, maintenance.RETENTION, A, lease=0.3)
    expires = await _expires_at(engine, maintenance.RETENTION)
    assert not await _lead(engine, maintenance.RETENTION, B)
    deadline = time.monotonic() + 10
    while not await _lead(engine, maintenance.RETENTION, B):
        assert time.monotonic() < deadline, "the expired lead was never taken over"
        await asyncio.sleep(0.02)
    async with engine.connect() as conn:
        assert await conn.scalar(sa.select(sa.func.now())) >= expires
        holder = await conn.scalar(sa.select(maintenance_leases.c.holder))
    assert holder == B
    # The former leader is now the one refused.
    assert not await _lead(engine, maintenance.RETENTION, A)


async def test_resigning_frees_the_task_at_once_and_only_its_leader_can(engine):
    assert await _lead(engine, maintenance.GAUGES, A, lease=60)
    await _resign(engine, maintenance.GAUGES, B)  # not the leader: nothing changes
    assert not await _lead(engine, maintenance.GAUGES, B)
    await _resign(engine, maintenance.GAUGES, A)
    assert await _lead(engine, maintenance.GAUGES, B)


# --- prune ------------------------------------------------------------------------------


def _id_at(epoch_seconds: float) -> uuid.UUID:
    """A time-ordered id (as `jobcore.ids.new_id` makes) for a job created at that time."""
    ms = int(epoch_seconds * 1000)
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | (0x7 << 76) | ((rand >> 62) & 0xFFF) << 64
    return uuid.UUID(int=value | (0b10 << 62) | (rand & 0x3FFF_FFFF_FFFF_FFFF))


async def _job(
    engine,
    status: Status,
    created_ago: float,
    finished_ago: float | None = None,
    key: str | None = None,
) -> uuid.UUID:
    """A job created `created_ago` seconds ago and finished `finished_ago` seconds ago."""
    job_id = _id_at(time.time() - created_ago)
    finished = (
        sa.func.now() - sa.text(f"interval '{finished_ago} seconds'")
        if finished_ago is not None
        else None
    )
    async with engine.begin() as conn:
        await conn.execute(
            sa.insert(jobs).values(
                id=job_id,
                type="sleep",
                payload={},
                max_attempts=3,
                status=status.value,
                idempotency_key=key,
                locked_until=sa.func.now() + sa.text("interval '1 minute'")
                if status is Status.PROCESSING
                else None,
                finished_at=finished,
            )
        )
    return job_id


async def _prune(engine, status: Status, age: float) -> int:
    async with engine.connect() as conn:
        return await compiled.prune(await driver(conn), status, age)


async def _ids(engine) -> set[uuid.UUID]:
    async with engine.connect() as conn:
        return set((await conn.scalars(sa.select(jobs.c.id))).all())


@pytest.mark.parametrize("status", sorted(FINISHED))
async def test_prune_deletes_only_its_status_finished_longer_ago_than_the_age(engine, status):
    old = [await _job(engine, status, 3 * HOUR, 2 * HOUR) for _ in range(3)]
    young = await _job(engine, status, 3 * HOUR, 10 * 60)
    others = [await _job(engine, s, 3 * HOUR, 2 * HOUR) for s in sorted(FINISHED - {status})]
    waiting = [await _job(engine, s, 3 * HOUR) for s in (Status.PENDING, Status.PROCESSING)]
    assert await _prune(engine, status, HOUR) == 3
    assert await _ids(engine) == {young, *others, *waiting}
    assert old and await _prune(engine, status, HOUR) == 0


async def test_no_prune_touches_pending_or_processing_jobs(engine):
    waiting = {await _job(engine, s, 30 * 24 * HOUR) for s in (Status.PENDING, Status.PROCESSING)}
    for status in FINISHED:
        assert await _prune(engine, status, 1.0) == 0
    assert await _ids(engine) == waiting


async def test_a_prune_deletes_at_most_a_batch_of_5000(engine):
    assert maintenance.PRUNE_BATCH == 5000
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                """
                INSERT INTO jobqueue.jobs
                    (id, type, payload, status, attempts, max_attempts, finished_at)
                SELECT encode(set_byte(b, 6, (get_byte(b, 6) & 15) | 112), 'hex')::uuid,
                       'sleep', '{}', 'completed', 1, 3, now() - interval '1 day'
                FROM generate_series(1, 6200) AS g,
                LATERAL (SELECT overlay(uuid_send(gen_random_uuid()) PLACING substring(int8send(
                             floor(extract(epoch FROM now() - interval '2 days' + g * interval
                                           '1 ms') * 1000)::bigint) FROM 3) FROM 1 FOR 6) AS b
                        ) AS ids
                """
            )
        )
    assert [await _prune(engine, Status.COMPLETED, HOUR) for _ in range(3)] == [5000, 1200, 0]
    assert await _ids(engine) == set()


async def test_a_job_created_long_ago_is_pruned_by_when_it_finished(engine):
    """The id bound (jobs created before now - age) keeps every job old enough in reach,
    and the finish time decides."""
    finished_long_ago = await _job(engine, Status.FAILED, 30 * 24 * HOUR, 7 * 24 * HOUR)
    finished_just_now = await _job(engine, Status.FAILED, 30 * 24 * HOUR, 0)
    assert await _prune(engine, Status.FAILED, 24 * HOUR) == 1
    assert await _ids(engine) == {finished_just_now}
    assert finished_long_ago


async def test_a_prune_reads_only_jobs_created_before_the_age(engine):
    """A job whose id is younger than the age is out of reach, whatever its finish time says
    (it cannot have finished before it was created): the bound that keeps a prune from
    reading the young finished jobs again every round."""
    inconsistent = await _job(engine, Status.COMPLETED, 60, 2 * HOUR)
    assert await _prune(engine, Status.COMPLETED, HOUR) == 0
    assert await _ids(engine) == {inconsistent}


async def test_a_prune_skips_rows_another_transaction_holds(engine):
    held = await _job(engine, Status.COMPLETED, 3 * HOUR, 2 * HOUR)
    free = [await _job(engine, Status.COMPLETED, 3 * HOUR, 2 * HOUR) for _ in range(2)]
    async with engine.connect() as holder:
        await holder.execute(sa.select(jobs.c.id).where(jobs.c.id == held).with_for_update())
        assert await asyncio.wait_for(_prune(engine, Status.COMPLETED, HOUR), 5) == 2
        await holder.rollback()
    assert free and await _ids(engine) == {held}
    assert await _prune(engine, Status.COMPLETED, HOUR) == 1


async def test_a_pruned_jobs_idempotency_key_is_free_again(engine):
    old = await _job(engine, Status.COMPLETED, 3 * HOUR, 2 * HOUR, key="nightly-7")
    assert await _prune(engine, Status.COMPLETED, HOUR) == 1
    async with engine.begin() as conn:
        job, created = await store.submit(
            conn, NewJob(new_id(), "sleep", {}, 3, idempotency_key="nightly-7")
        )
    assert created and job.id != old
