"""Jobs put into each status through the store's own statements, for the API tests of
control and visibility: a submit, a claim of one given job, and the worker's outcome
writes (which notify waiters, as a worker's would)."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import compiled, control, store
from jobcore.ids import new_id
from jobcore.rows import Job, Lease, NewJob
from jobcore.states import Operation, Status
from tests.pg import driver

# Claims the one job named, whatever else is due: the tests choose which job runs.
_TAKE = sa.text(
    "UPDATE jobqueue.jobs SET status = 'processing', attempts = attempts + 1, "
    "lease_token = lease_token + 1, locked_until = now() + interval '10 minutes', "
    "updated_at = now() WHERE id = :id AND status = 'pending' RETURNING lease_token"
)

ENDINGS = {
    Status.COMPLETED: Operation.COMPLETE,
    Status.FAILED: Operation.FAIL,
    Status.DEAD_LETTER: Operation.DEAD_LETTER,
}


async def submit(engine: AsyncEngine, job_type: str = "sleep", **fields: Any) -> Job:
    fields.setdefault("max_attempts", 3)
    async with engine.begin() as conn:
        job, _ = await store.submit(conn, NewJob(new_id(), job_type, {}, **fields))
    return job


async def take(engine: AsyncEngine, job_id: UUID) -> Lease:
    """pending -> processing, as a claim of this job."""
    async with engine.begin() as conn:
        token = (await conn.execute(_TAKE, {"id": job_id})).scalar_one()
    return Lease(job_id, token)


async def end(engine: AsyncEngine, lease: Lease, status: Status, result: Any = None) -> None:
    """processing -> `status` (completed, failed, dead_letter) through the fenced write."""
    operation = ENDINGS[status]
    async with engine.begin() as conn:
        raw = await driver(conn)
        if operation is Operation.COMPLETE:
            lost = await compiled.record(raw, operation, [lease], results=[json.dumps(result)])
        else:
            lost = await compiled.record(raw, operation, [lease], ["boom"])
    assert lost == []


async def in_status(engine: AsyncEngine, status: Status, **fields: Any) -> Job:
    """A job that has reached `status` the way jobs do."""
    job = await submit(engine, **fields)
    if status is Status.PENDING:
        return job
    lease = await take(engine, job.id)
    if status in ENDINGS:
        await end(engine, lease, status)
    elif status is Status.CANCELLED:
        await end(engine, lease, Status.DEAD_LETTER)
        async with engine.begin() as conn:
            assert await control.cancel(conn, job.id) is not None
    return await get(engine, job.id)


async def get(engine: AsyncEngine, job_id: UUID) -> Job:
    async with engine.connect() as conn:
        job = await store.get(conn, job_id)
    assert job is not None
    return job
