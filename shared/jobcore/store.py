"""The API's and the tests' calls on a SQLAlchemy connection: submit one job or many, read
one, count the capped queues' pending jobs, find stored idempotency keys, wake the workers.

Each runs one statement of `jobcore.queries` (or two, for a batch with replays); the API's
hot path runs the same statements on asyncpg (`jobqueue_api.calls`), the worker its own
(`jobcore.compiled`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncConnection

from jobcore import idempotency, queries
from jobcore.errors import IdempotencyConflict
from jobcore.floors import Counted, CountFloors
from jobcore.rows import Job, NewJob, Submitted, job_from_row


async def submit(conn: AsyncConnection, new: NewJob, *, notify: bool = False) -> tuple[Job, bool]:
    """Insert a job, or return the job already bound to its idempotency key.

    Returns (job, created). Raises IdempotencyConflict when the key is bound to a
    different type, payload (compared as jsonb), max_attempts, queue, priority, timeout
    or concurrency_key. With `notify`, a created job also wakes listening workers (at
    commit).
    """
    statement = queries.JOB_SUBMIT_NOTIFY if notify else queries.JOB_SUBMIT
    row = (
        (await conn.execute(statement, queries.submit_params(new, new.payload))).mappings().first()
    )
    if row is None:
        assert new.idempotency_key is not None
        raise IdempotencyConflict(new.idempotency_key)
    return job_from_row(row), bool(row["created"])


async def submit_many(conn: AsyncConnection, new_jobs: Sequence[NewJob]) -> list[Submitted]:
    """Insert many jobs in one statement; results in input order.

    Idempotency works as in `submit`. An idempotency key repeated inside the
    batch behaves as if the items were sent one after another: the first one
    decides, later ones are replays of it or conflicts. (The API runs the same steps on
    asyncpg: jobqueue_api.calls.submit_many.)
    """
    if not new_jobs:  # queries.JOB_SUBMIT_MANY_KEYLESS's shared values need a first item
        return []
    rows, first = idempotency.batch_rows(new_jobs)
    payloads = [json.dumps(new.payload) for new in rows]
    if not first:
        await conn.execute(queries.JOB_SUBMIT_MANY_KEYLESS, queries.keyless_params(rows, payloads))
        return [Submitted("created", new.id) for new in new_jobs]
    by_key = idempotency.returned_by_key(
        (
            await conn.execute(queries.JOB_SUBMIT_MANY, queries.many_params(rows, payloads))
        ).mappings()
    )
    replays, replayed_payloads = idempotency.to_compare(new_jobs, by_key, json.dumps)
    matched = {}
    if replays:
        values = queries.many_params(replays, replayed_payloads)
        found = await conn.execute(queries.JOB_MATCH_REQUESTS, values)
        matched = idempotency.matched_by_item(found.mappings())
    return idempotency.batch_results(new_jobs, first, by_key, matched)


async def get(conn: AsyncConnection, job_id: UUID) -> Job | None:
    row = (await conn.execute(queries.JOB_GET, {"id": job_id})).mappings().first()
    return job_from_row(row, full=True) if row is not None else None


async def pending_depths(
    conn: AsyncConnection,
    caps: dict[str, int],
    others: int | None,
    floors: CountFloors | None = None,
    sweep: bool = True,
) -> tuple[dict[str, int], list[Counted]]:
    """Pending jobs of each capped queue (at most its cap; queues holding none may be
    absent), and where the read found each queue's first pending jobs, for `floors` to
    learn. Read from the head, or with `floors` from them unless this is a `sweep`."""
    counts = {"queues": list(caps), "caps": list(caps.values()), "others": others}
    where = (floors or CountFloors()).params(sweep=sweep or floors is None, leases=False)
    rows = (await conn.execute(queries.JOB_COUNT_PENDING, {**counts, **where})).all()
    counted = [Counted(row.queue, row.priorities, row.firsts) for row in rows]
    return {row.queue: row.pending for row in rows}, counted


async def existing_keys(conn: AsyncConnection, keys: set[str]) -> set[str]:
    """Those of `keys` that name a stored job."""
    rows = await conn.execute(queries.JOB_FIND_KEYS, {"keys": sorted(keys)})
    return {row.idempotency_key for row in rows}


async def notify(conn: AsyncConnection) -> None:
    """Tell listening workers that jobs are due (delivered when the transaction commits)."""
    await conn.execute(queries.JOB_NOTIFY)
