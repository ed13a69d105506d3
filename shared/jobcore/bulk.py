"""Bulk actions: cancel or retry the jobs a filter matches (`POST /jobs/cancel`,
`POST /jobs/retry`, the CLI's `cancel`/`retry` by filter, the dashboard's selections).

A filter names statuses, a type, a queue and/or ids, like `GET /jobs`
(docs/api.md#bulk-actions). The matching jobs that allow the operation are found a page at
a time, newest first (`jobcore.search`), and each page is changed by the operation's own
guarded statement for many jobs (`jobcore.control`), which commits on its own: a job that
moved meanwhile (claimed, finished) is changed only if it still matches the filter and its
new status allows it (asked to stop if it is now running); it is never changed twice. At
most `limit` jobs are changed per call; `more` says whether matching jobs that allow it
were left.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.ext.asyncio import AsyncConnection

from jobcore.control import JOB_CANCEL_MANY, JOB_REQUEST_CANCEL_MANY, JOB_RETRY_MANY
from jobcore.errors import InvalidRequest
from jobcore.queries.common import HISTORY_COLUMNS, JOB_COLUMNS
from jobcore.rows import Job, job_from_row
from jobcore.schema import QUEUE_PATTERN, jobs, jobs_history
from jobcore.search import MAX_LIMIT, Filters, list_jobs
from jobcore.states import Operation, Status
from jobcore.validation import QUEUE, check_string

c = jobs.c

MAX_IDS = 1000
MAX_BULK_LIMIT = 10_000
DEFAULT_BULK_LIMIT = 1000
# Jobs per statement: each batch commits on its own and holds its row locks briefly.
BATCH = MAX_LIMIT
FIELDS = ("status", "type", "queue", "ids", "limit")
CANCELLABLE: frozenset[Status] = Operation.CANCEL.sources | Operation.REQUEST_CANCEL.sources
RETRYABLE: frozenset[Status] = Operation.MANUAL_RETRY.sources
# A job can move between the statements (a pending one claimed, a running one handed
# back) or be held by another transaction (the statements skip it): tries per batch before
# the jobs still left are left as they are.
_TRIES = 5
# Seconds between tries: a row held by a claimer or a completer is free again within ms.
_PAUSE = 0.01

_IDS = sa.bindparam("job_ids", type_=pg.ARRAY(pg.UUID(as_uuid=True)))
# In either table (a job is in one): completed jobs move to `jobs_history`.
_FOUND = sa.union_all(
    sa.select(*JOB_COLUMNS).where(c.id == sa.any_(_IDS)),
    sa.select(*HISTORY_COLUMNS).where(jobs_history.c.id == sa.any_(_IDS)),
).subquery("found")
JOB_GET_MANY = sa.select(_FOUND).order_by(_FOUND.c.id.desc())

# By their SQL name, for `jobcore.queries.named()`.
NAMED = {"job_get_many": JOB_GET_MANY}


@dataclass(frozen=True)
class Selection:
    """Which jobs a bulk action applies to: those matching every criterion given (None:
    any), at most `limit` of them."""

    statuses: frozenset[Status] | None = None
    type: str | None = None
    queue: str | None = None
    ids: tuple[UUID, ...] | None = None
    limit: int = DEFAULT_BULK_LIMIT

    def matches(self, job: Job) -> bool:
        return (
            (self.statuses is None or job.status in self.statuses)
            and (self.type is None or job.type == self.type)
            and (self.queue is None or job.queue == self.queue)
        )


@dataclass(frozen=True)
class BulkCancelled:
    cancelled: int  # pending or dead_letter: cancelled at once
    cancel_requested: int  # processing: their holders were asked to stop them
    more: bool  # matching cancellable jobs were left (the limit was reached)


@dataclass(frozen=True)
class BulkRetried:
    retried: int
    more: bool


def selection_from_json(body: Any) -> Selection:
    """The selection a request's JSON body asks for; InvalidRequest naming the field at
    fault. A field that is null counts as absent."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("the body must be a JSON object with some of: " + ", ".join(FIELDS))
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise InvalidRequest(
            f"unknown field {str(unknown[0])[:100]!r}; the fields are: {', '.join(FIELDS)}"
        )
    given = {name: value for name, value in body.items() if value is not None}
    if not {"status", "type", "queue", "ids"} & set(given):
        raise InvalidRequest("give at least one of 'status', 'type', 'queue' or 'ids'")
    return Selection(
        statuses=_statuses(given["status"]) if "status" in given else None,
        type=_type(given["type"]) if "type" in given else None,
        queue=_queue(given["queue"]) if "queue" in given else None,
        ids=_ids(given["ids"]) if "ids" in given else None,
        limit=_limit(given["limit"]) if "limit" in given else DEFAULT_BULK_LIMIT,
    )


def _statuses(value: Any) -> frozenset[Status]:
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise InvalidRequest(
            "field 'status' must be a non-empty list of statuses or a comma-separated string"
        )
    found = set()
    for name in names:
        try:
            found.add(Status(name))
        except ValueError:
            raise InvalidRequest(
                f"unknown status {name[:100]!r} in field 'status'; "
                f"one of: {', '.join(sorted(s.value for s in Status))}"
            ) from None
    return frozenset(found)


def _type(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequest("field 'type' must be a non-empty string")
    check_string(value, "field 'type'")
    return value


def _queue(value: Any) -> str:
    if not isinstance(value, str) or QUEUE.fullmatch(value) is None:
        raise InvalidRequest(f"field 'queue' must match {QUEUE_PATTERN}")
    return value


def _ids(value: Any) -> tuple[UUID, ...]:
    if not isinstance(value, list) or len(value) > MAX_IDS:
        raise InvalidRequest(f"field 'ids' must be a list of at most {MAX_IDS} job ids")
    found = []
    for n, item in enumerate(value):
        try:
            if not isinstance(item, str):
                raise ValueError(item)
            found.append(UUID(item))
        except ValueError:
            raise InvalidRequest(f"field 'ids'[{n}] is not a job id (a UUID)") from None
    return tuple(dict.fromkeys(found))


def _limit(value: Any) -> int:
    # An integer as JSON Schema counts them: 100.0 is one.
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not integral or not 1 <= value <= MAX_BULK_LIMIT:
        raise InvalidRequest(f"field 'limit' must be an integer from 1 to {MAX_BULK_LIMIT}")
    return int(value)


async def cancel_matching(conn: AsyncConnection, selection: Selection) -> BulkCancelled:
    """Cancel the jobs `selection` matches: pending and dead_letter ones at once, running ones
    by asking their holders (each announced on `jobcore.control.CANCEL_CHANNEL`); a running
    job already asked is left out. `conn` must not be in a transaction: each batch commits
    on its own."""

    def wanted(job: Job) -> bool:
        return job.status in CANCELLABLE and (
            job.status is not Status.PROCESSING or job.cancel_requested_at is None
        )

    cancelled = requested = 0
    # A job must still match the selection when it is changed: one claimed since it was
    # read as pending gets no cancel request unless `processing` was asked for too.
    selected = selection.statuses if selection.statuses is not None else CANCELLABLE
    at_once = bool(selected & {Status.PENDING, Status.DEAD_LETTER})
    ask = Status.PROCESSING in selected

    async def apply(ids: list[UUID]) -> int:
        nonlocal cancelled, requested
        changed = 0
        left = set(ids)
        for _ in range(_TRIES):
            if at_once:
                done = await _ids_changed(conn, JOB_CANCEL_MANY, left)
                cancelled += len(done)
                changed += len(done)
                left -= done
            if left and ask:
                done = await _ids_changed(conn, JOB_REQUEST_CANCEL_MANY, left)
                requested += len(done)
                changed += len(done)
                left -= done
            if not left:
                break
            # Neither: held by another transaction (skipped), claimed or handed back between
            # the two statements, or finished.
            await asyncio.sleep(_PAUSE)
            left = {
                job.id
                for job in await _get_many(conn, left)
                if selection.matches(job) and wanted(job)
            }
            if not left:
                break
        # What was changed counts against the limit; a job that went away did not.
        return changed

    more = await _apply_in_batches(conn, selection, CANCELLABLE, wanted, apply)
    return BulkCancelled(cancelled, requested, more)


async def retry_matching(conn: AsyncConnection, selection: Selection) -> BulkRetried:
    """Retry the dead_letter, failed and cancelled jobs `selection` matches, each with a
    fresh attempt budget (as `jobcore.control.manual_retry`). `conn` must not be in a
    transaction: each batch commits on its own. The caller wakes the workers when some were
    retried."""

    def wanted(job: Job) -> bool:
        return job.status in RETRYABLE

    retried = 0

    async def apply(ids: list[UUID]) -> int:
        nonlocal retried
        changed = 0
        left = set(ids)
        for tried in range(1, _TRIES + 1):
            done = await _ids_changed(conn, JOB_RETRY_MANY, left)
            changed += len(done)
            left -= done
            if not left or tried == _TRIES:
                break
            # Held by another transaction (skipped), or no longer retryable.
            await asyncio.sleep(_PAUSE * tried)
            left = {job.id for job in await _get_many(conn, left) if wanted(job)}
        retried += changed
        return changed

    more = await _apply_in_batches(conn, selection, RETRYABLE, wanted, apply)
    return BulkRetried(retried, more)


async def _apply_in_batches(
    conn: AsyncConnection,
    selection: Selection,
    allowed: frozenset[Status],
    wanted: Callable[[Job], bool],
    apply: Callable[[list[UUID]], Awaitable[int]],
) -> bool:
    """Run `apply` on the wanted jobs of `selection`, a batch at a time, until `limit` jobs
    were changed; True if wanted jobs were left."""
    budget = selection.limit
    async for page in _pages(conn, selection, allowed):
        candidates = [job.id for job in page if selection.matches(job) and wanted(job)]
        while candidates:
            if budget <= 0:
                return True
            batch, candidates = candidates[:budget], candidates[budget:]
            budget -= await apply(batch)
    return False


async def _pages(
    conn: AsyncConnection, selection: Selection, allowed: frozenset[Status]
) -> AsyncIterator[list[Job]]:
    statuses = allowed if selection.statuses is None else selection.statuses & allowed
    if not statuses:
        return
    if selection.ids is not None:
        for chunk in _chunks(selection.ids, BATCH):
            yield await _get_many(conn, chunk)
        return
    filters = Filters(statuses, selection.type, selection.queue)
    before = None
    while True:
        page, before = await list_jobs(conn, filters, BATCH, before)
        yield page
        if before is None:
            return


def _chunks(ids: Sequence[UUID], size: int) -> Iterator[Sequence[UUID]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


# Each statement in a transaction of its own, committed before the next: the reads of
# `search.list_jobs` leave the connection in READ COMMITTED (not autocommit) behind them.
async def _get_many(conn: AsyncConnection, ids: Any) -> list[Job]:
    async with conn.begin():
        rows = (await conn.execute(JOB_GET_MANY, {"job_ids": list(ids)})).mappings().all()
    return [job_from_row(row) for row in rows]


async def _ids_changed(conn: AsyncConnection, statement: Any, ids: set[UUID]) -> set[UUID]:
    if not ids:
        return set()
    async with conn.begin():
        rows = (await conn.execute(statement, {"job_ids": sorted(ids)})).all()
    return {row.id for row in rows}
