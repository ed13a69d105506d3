"""An operator's actions on one job, and waiting for a job to finish: retry, cancel, watch.

One statement per operation (and its form for many jobs, which `jobcore.bulk` runs),
guarded by its declaration in `jobcore.states`, run by the API on a SQLAlchemy connection
(docs/api.md). A cancel of a running job only records the request and announces it on
`CANCEL_CHANNEL`; the worker holding the job stops the attempt and writes `cancel_attempt`
through the fence (`jobcore.queries.job_outcome`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.ext.asyncio import AsyncConnection

from jobcore.queries.common import JOB_COLUMNS, WOKE, guard, status_in, status_literal
from jobcore.rows import Job, job_from_row
from jobcore.schema import jobs
from jobcore.states import FINISHED, Operation, Status
from jobcore.store import get

c = jobs.c

# Workers LISTEN on this channel: the id of a running job whose cancel was requested.
CANCEL_CHANNEL = "jobqueue_cancel"

# Each operation's statement is built for one job (`job_id`) and for many (`job_ids`, the
# bulk actions of `jobcore.bulk`): the same guard and the same values, row by row.
_ONE = c.id == sa.bindparam("job_id")
# Many rows are locked first, in id order and skipping those another transaction holds
# (a claimer's or a completer's, which lock theirs as they go): the statement never waits
# for a row, so it cannot deadlock with them; `jobcore.bulk` tries the skipped ones again.
_LOCKED = (
    sa.select(c.id)
    .where(c.id == sa.any_(sa.bindparam("job_ids", type_=pg.ARRAY(pg.UUID(as_uuid=True)))))
    .order_by(c.id)
    .with_for_update(skip_locked=True)
)
_MANY = c.id == sa.any_(sa.func.array(_LOCKED.scalar_subquery()))


def _retry(which: Any) -> Any:
    return (
        sa.update(jobs)
        .where(which, guard(Operation.MANUAL_RETRY))
        .values(
            status=status_literal(Status.PENDING),
            attempts=0,
            run_at=sa.func.now(),
            result=sa.null(),
            cancel_requested_at=sa.null(),
            finished_at=sa.null(),
            awaited=sa.false(),
            updated_at=sa.func.now(),
        )
    )


def _cancel(which: Any) -> Any:
    return (
        sa.update(jobs)
        .where(which, guard(Operation.CANCEL))
        .values(
            status=status_literal(Status.CANCELLED),
            finished_at=sa.func.now(),
            updated_at=sa.func.now(),
        )
    )


_ANNOUNCED = sa.func.pg_notify(
    sa.literal_column(f"'{CANCEL_CHANNEL}'"), sa.cast(c.id, sa.Text)
).label("announced")


def _request_cancel(which: Any) -> Any:
    return (
        sa.update(jobs)
        .where(which, guard(Operation.REQUEST_CANCEL))
        .values(
            cancel_requested_at=sa.func.coalesce(c.cancel_requested_at, sa.func.now()),
            updated_at=sa.func.now(),
        )
    )


JOB_RETRY = _retry(_ONE).returning(*JOB_COLUMNS)
JOB_RETRY_MANY = _retry(_MANY).returning(c.id)
JOB_CANCEL = _cancel(_ONE).returning(*JOB_COLUMNS, WOKE)
JOB_CANCEL_MANY = _cancel(_MANY).returning(c.id, WOKE)
# The first request's time stands; every request of one job announces it again (a holder
# that missed the first announcement hears the next). A bulk request leaves out the jobs
# already asked: they are not asked, nor counted, twice.
JOB_REQUEST_CANCEL = _request_cancel(_ONE).returning(*JOB_COLUMNS, _ANNOUNCED)
JOB_REQUEST_CANCEL_MANY = (
    _request_cancel(_MANY).where(c.cancel_requested_at.is_(None)).returning(c.id, _ANNOUNCED)
)

# A waiter marks the job it waits for, unless it has finished already: the write that
# finishes it then notifies (`queries.FINISHED_CHANNEL`). No row: finished (or unknown).
JOB_WATCH = (
    sa.update(jobs)
    .where(c.id == sa.bindparam("job_id"), sa.not_(status_in(FINISHED)))
    .values(awaited=sa.true())
    .returning(c.id)
)


class Cancelled(StrEnum):
    """What `cancel` did."""

    CANCELLED = "cancelled"  # pending or dead_letter: cancelled at once
    REQUESTED = "requested"  # processing: the holder was asked to stop the attempt
    REFUSED = "refused"  # finished already: completed, failed or cancelled


# A job may move between the statements' snapshots (e.g. processing -> pending when its
# attempt is retried): try again, a few times at most.
# By their SQL name, for `jobcore.queries.named()`.
NAMED = {
    "job_retry": JOB_RETRY,
    "job_retry_many": JOB_RETRY_MANY,
    "job_cancel": JOB_CANCEL,
    "job_cancel_many": JOB_CANCEL_MANY,
    "job_request_cancel": JOB_REQUEST_CANCEL,
    "job_request_cancel_many": JOB_REQUEST_CANCEL_MANY,
    "job_watch": JOB_WATCH,
}

_CANCEL_TRIES = 5


async def cancel(conn: AsyncConnection, job_id: UUID) -> tuple[Job, Cancelled] | None:
    """Cancel the job: at once if no worker holds it, else by asking its holder (the job is
    returned with `cancel_requested_at` set). None if there is no such job."""
    job = None
    for _ in range(_CANCEL_TRIES):
        row = await _first(conn, JOB_CANCEL, job_id)
        if row is not None:
            return job_from_row(row), Cancelled.CANCELLED
        row = await _first(conn, JOB_REQUEST_CANCEL, job_id)
        if row is not None:
            return job_from_row(row), Cancelled.REQUESTED
        job = await get(conn, job_id)
        if job is None:
            return None
        if job.status not in Operation.CANCEL.sources | Operation.REQUEST_CANCEL.sources:
            return job, Cancelled.REFUSED
    # Moved between the statements every time: leave it as it is now.
    return (job, Cancelled.REFUSED) if job is not None else None


async def manual_retry(conn: AsyncConnection, job_id: UUID) -> Job | None:
    """dead_letter, failed or cancelled -> pending with a fresh attempt budget; None if the
    job is in no such status."""
    row = await _first(conn, JOB_RETRY, job_id)
    return job_from_row(row) if row is not None else None


async def watch(conn: AsyncConnection, job_id: UUID) -> bool:
    """Ask to be notified when the job finishes; False if it has finished (or is unknown),
    so there is nothing to wait for. Listen on `FINISHED_CHANNEL` before calling this."""
    return await _first(conn, JOB_WATCH, job_id) is not None


async def _first(conn: AsyncConnection, statement: Any, job_id: UUID) -> Any:
    return (await conn.execute(statement, {"job_id": job_id})).mappings().first()
