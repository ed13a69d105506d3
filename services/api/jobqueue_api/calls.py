"""The API's hot calls: submit, submit_group, submit_many and the read of one job, as
`jobcore.store`'s constructs compiled once (`jobcore.compiled.Compiled`) and run on asyncpg.

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
from typing import Any
from uuid import UUID

import asyncpg

from jobcore import store
from jobcore.compiled import Compiled, Driver
from jobcore.errors import IdempotencyConflict
from jobcore.states import Status
from jobqueue_api.jsonio import dumps_text

STATEMENTS: dict[str, Compiled] = {
    "submit": Compiled(store.SUBMIT),
    "submit_and_notify": Compiled(store.SUBMIT_AND_NOTIFY),
    "submit_many": Compiled(store.SUBMIT_MANY),
    "submit_many_keyless": Compiled(store.SUBMIT_MANY_KEYLESS),
    "submit_group": Compiled(store.SUBMIT_GROUP),
    "submit_group_and_notify": Compiled(store.SUBMIT_GROUP_AND_NOTIFY),
    "get_by_keys": Compiled(store.GET_BY_KEYS),
    "get": Compiled(store.GET),
    "notify": Compiled(store.NOTIFY),
}
_SUBMIT = STATEMENTS["submit"]
_SUBMIT_AND_NOTIFY = STATEMENTS["submit_and_notify"]
_SUBMIT_MANY = STATEMENTS["submit_many"]
_SUBMIT_MANY_KEYLESS = STATEMENTS["submit_many_keyless"]
_SUBMIT_GROUP = STATEMENTS["submit_group"]
_SUBMIT_GROUP_AND_NOTIFY = STATEMENTS["submit_group_and_notify"]
_GET_BY_KEYS = STATEMENTS["get_by_keys"]
_GET = STATEMENTS["get"]
_NOTIFY = STATEMENTS["notify"]

# A job is built from its row by position: SUBMIT's, SUBMIT_GROUP's and GET's columns are
# Job's fields, in order (SUBMIT then adds `created`).
_JOB_FIELDS = list(store.Job.__dataclass_fields__)
_WIDTH = len(_JOB_FIELDS)
_STATUS = _JOB_FIELDS.index("status")
for _columns in (
    store.SUBMIT.returning_column_descriptions,
    store.SUBMIT_AND_NOTIFY.column_descriptions,
    store.SUBMIT_GROUP.returning_column_descriptions,
    store.GET.column_descriptions,
):
    if [c["name"] for c in _columns][: _WIDTH + 1] != [*_JOB_FIELDS, "created"][: len(_columns)]:
        raise RuntimeError("SUBMIT's and GET's columns must be Job's fields (then `created`)")


def _job(row: Any) -> store.Job:
    values = list(row[:_WIDTH])
    values[_STATUS] = Status.read(values[_STATUS])
    return store.Job(*values)


async def submit(
    conn: Driver, new: store.NewJob, *, notify: bool = False, again: bool = False
) -> tuple[store.Job, bool]:
    """`store.submit`: insert a job, or return the job already bound to its idempotency
    key; (job, created). Raises IdempotencyConflict.

    `again`: this is a second try after a first whose connection died, which may have
    inserted the job. The id is the request's own, so the job is found again by it: as the
    primary key the retried insert runs into (read back), or as the job its key names.
    """
    statement = _SUBMIT_AND_NOTIFY if notify else _SUBMIT
    try:
        rows = await conn.fetch(
            statement.sql, *statement.args(store.submit_params(new, dumps_text(new.payload)))
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
    job = _job(row)
    return job, bool(row[_WIDTH]) or (again and job.id == new.id)


async def submit_group(
    conn: Driver, new_jobs: Sequence[store.NewJob], *, notify: bool = False
) -> list[store.Job]:
    """Insert `new_jobs` (none with an idempotency key) in one statement; their jobs, in
    input order. With `notify`, one NOTIFY for them all, delivered at commit."""
    statement = _SUBMIT_GROUP_AND_NOTIFY if notify else _SUBMIT_GROUP
    payloads = [dumps_text(new.payload) for new in new_jobs]
    values = store.keyless_params(new_jobs, payloads)
    rows = await conn.fetch(statement.sql, *statement.args(values))
    by_id = {row[0]: row for row in rows}
    return [_job(by_id[new.id]) for new in new_jobs]


async def get(conn: Driver, job_id: UUID) -> store.Job | None:
    """`store.get`: the job, or None."""
    rows = await conn.fetch(_GET.sql, *_GET.args({"id": job_id}))
    return _job(rows[0]) if rows else None


async def notify(conn: Driver) -> None:
    """`store.notify`: wake listening workers (at once: outside a transaction)."""
    await conn.fetch(_NOTIFY.sql, *_NOTIFY.args({}))


async def submit_many(conn: Driver, new_jobs: Sequence[store.NewJob]) -> list[store.Submitted]:
    """`store.submit_many`'s steps: every job in one statement; per-item results in input
    order (a key repeated inside the batch: the first item decides)."""
    rows, first = store.batch_rows(new_jobs)
    payloads = [dumps_text(new.payload) for new in rows]
    if not first:
        values = store.keyless_params(rows, payloads)
        await conn.fetch(_SUBMIT_MANY_KEYLESS.sql, *_SUBMIT_MANY_KEYLESS.args(values))
        return [store.Submitted("created", new.id) for new in new_jobs]
    values = store.many_params(rows, payloads)
    by_key = store.returned_by_key(await conn.fetch(_SUBMIT_MANY.sql, *_SUBMIT_MANY.args(values)))
    keys = store.keys_to_compare(first, by_key)
    stored: dict[str, store.NewJob] = {}
    if keys:
        found = await conn.fetch(_GET_BY_KEYS.sql, *_GET_BY_KEYS.args({"keys": keys}))
        stored = store.stored_requests(found)
    return store.batch_results(new_jobs, first, by_key, stored)
