"""The API's hot calls: submit, submit_group, submit_many and the read of one job, as
`jobcore.queries`' constructs compiled once (`jobcore.runner.of`) and run on asyncpg,
their rows read by column name.

A submit through a SQLAlchemy connection spent more CPU in SQLAlchemy (execution
context, result processing, the greenlet hop) than in everything else it does
(docs/performance.md, "API submit"). These calls run the very statements `store.submit`,
`store.submit_many` and `store.get` run, compiled at import, on the asyncpg connection
under a pooled one (`database.on_driver` checks it out, in turn, and retries a call whose
connection turned out dead). There is no SQL here: `tests/api/test_calls.py` pins every
statement to its construct, and the results to those of the store's calls.

The connection must come from the API's engine (`database.open_engine`): SQLAlchemy sets
its jsonb codec, which takes JSON text and decodes with orjson (`jsonio.loads`).
Outside a transaction, each statement commits on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

import asyncpg

from jobcore import idempotency, queries, runner
from jobcore.errors import IdempotencyConflict
from jobcore.queries.job_types import record_from_row
from jobcore.rows import Job, JobTypeRecord, NewJob, Submitted, job_from_row
from jobcore.runner import Driver
from jobqueue_api.jsonio import dumps_text

_SUBMIT = runner.of(queries.JOB_SUBMIT)
_SUBMIT_AND_NOTIFY = runner.of(queries.JOB_SUBMIT_NOTIFY)
_SUBMIT_MANY = runner.of(queries.JOB_SUBMIT_MANY)
_SUBMIT_MANY_KEYLESS = runner.of(queries.JOB_SUBMIT_MANY_KEYLESS)
_SUBMIT_GROUP = runner.of(queries.JOB_SUBMIT_GROUP)
_SUBMIT_GROUP_NOTIFY = runner.of(queries.JOB_SUBMIT_GROUP_NOTIFY)
_MATCH_REQUESTS = runner.of(queries.JOB_MATCH_REQUESTS)
_GET = runner.of(queries.JOB_GET)
_NOTIFY = runner.of(queries.JOB_NOTIFY)
_TYPE_LIST = runner.of(queries.JOB_TYPE_LIST)


async def submit(
    conn: Driver, new: NewJob, *, notify: bool = False, again: bool = False
) -> tuple[Job, bool]:
    """`store.submit`: insert a job, or return the job already bound to its idempotency
    key; (job, created). Raises IdempotencyConflict.

    `again`: this is a second try after a first whose connection died, which may have
    inserted the job. The id is the request's own, so the job is found again by it: as the
    primary key the retried insert runs into (read back), or as the job its key names.
    """
    statement = _SUBMIT_AND_NOTIFY if notify else _SUBMIT
    try:
        rows = await conn.fetch(
            statement.sql, *statement.args(queries.submit_params(new, dumps_text(new.payload)))
        )
    except asyncpg.UniqueViolationError:
        stored = await get(conn, new.id) if again else None
        if stored is None:
            raise
        return stored, True
    if not rows:
        assert new.idempotency_key is not None
        raise IdempotencyConflict(new.idempotency_key)
    row = rows[0]
    job = job_from_row(row)
    return job, bool(row["created"]) or (again and job.id == new.id)


async def submit_group(
    conn: Driver, new_jobs: Sequence[NewJob], *, notify: bool = False
) -> list[Job]:
    """Insert `new_jobs` (none with an idempotency key) in one statement; their jobs, in
    input order. With `notify`, one NOTIFY for them all, delivered at commit."""
    statement = _SUBMIT_GROUP_NOTIFY if notify else _SUBMIT_GROUP
    payloads = [dumps_text(new.payload) for new in new_jobs]
    values = queries.keyless_params(new_jobs, payloads)
    rows = await conn.fetch(statement.sql, *statement.args(values))
    by_id = {row["id"]: row for row in rows}
    return [job_from_row(by_id[new.id]) for new in new_jobs]


async def get(conn: Driver, job_id: UUID) -> Job | None:
    """`store.get`: the job, or None."""
    rows = await conn.fetch(_GET.sql, *_GET.args({"id": job_id}))
    return job_from_row(rows[0], full=True) if rows else None


async def notify(conn: Driver) -> None:
    """`store.notify`: wake listening workers (at once: outside a transaction)."""
    await conn.fetch(_NOTIFY.sql, *_NOTIFY.args({}))


async def submit_many(conn: Driver, new_jobs: Sequence[NewJob]) -> list[Submitted]:
    """`store.submit_many`'s steps: every job in one statement; per-item results in input
    order (a key repeated inside the batch: the first item decides)."""
    rows, first = idempotency.batch_rows(new_jobs)
    payloads = [dumps_text(new.payload) for new in rows]
    if not first:
        values = queries.keyless_params(rows, payloads)
        await conn.fetch(_SUBMIT_MANY_KEYLESS.sql, *_SUBMIT_MANY_KEYLESS.args(values))
        return [Submitted("created", new.id) for new in new_jobs]
    values = queries.many_params(rows, payloads)
    by_key = idempotency.returned_by_key(
        await conn.fetch(_SUBMIT_MANY.sql, *_SUBMIT_MANY.args(values))
    )
    replays, replayed_payloads = idempotency.to_compare(new_jobs, by_key, dumps_text)
    matched: dict[UUID, tuple[UUID, bool]] = {}
    if replays:
        values = queries.many_params(replays, replayed_payloads)
        found = await conn.fetch(_MATCH_REQUESTS.sql, *_MATCH_REQUESTS.args(values))
        matched = idempotency.matched_by_item(found)
    return idempotency.batch_results(new_jobs, first, by_key, matched)


async def recorded_types(conn: Driver, max_age: float) -> list[JobTypeRecord]:
    """The types the workers recorded within `max_age` seconds (`queries.JOB_TYPE_LIST`)."""
    rows = await conn.fetch(_TYPE_LIST.sql, *_TYPE_LIST.args({"max_age": max_age}))
    return [record_from_row(row) for row in rows]
