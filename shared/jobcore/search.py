"""Reading many jobs: the list (`GET /jobs`) and the depth of each queue (`GET /queues`, the
worker's queue gauges).

The list is newest first (`id` descending; ids are time-ordered) and pages by keyset:
a page asks for ids below the last one it saw, never an OFFSET, so jobs inserted
meanwhile are neither skipped nor repeated, and no page counts the table. Each
status is read on its own, in id order, through the index that leads with the
filters given (`jobs_status_idx`, `jobs_type_idx`, `jobs_queue_idx`; running jobs
through `jobs_lease_idx`), and the branches are merged: a page reads at most
`limit` entries per status it asks for, however large the table. Given both a type and a
queue, it reads the index of one and filters by the other: as many entries as it takes to
find `limit` matches.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.ext.asyncio import AsyncConnection

from jobcore.floors import Counted
from jobcore.queries.common import HISTORY_COLUMNS, JOB_COLUMNS, status_literal
from jobcore.queries.job_claim import FLOOR, PRIORITIES
from jobcore.queries.present import QUEUES_LISTED, from_micros, micros, queues_present
from jobcore.rows import Job, job_from_row
from jobcore.schema import jobs, jobs_history
from jobcore.states import Status

c = jobs.c
h = jobs_history.c

MAX_LIMIT = 500
DEFAULT_LIMIT = 50


@dataclass(frozen=True)
class Filters:
    """What a list asks for; None: any."""

    statuses: Collection[Status] | None = None
    type: str | None = None
    queue: str | None = None


def list_statement(filters: Filters, *, after: bool) -> Any:
    """The page query for `filters`: parameters `limit`, `type` and `queue` (those given),
    and `before` (the last id of the previous page) when `after` is true."""
    statuses = None if filters.statuses is None else frozenset(filters.statuses)
    return _statement(statuses, filters.type is not None, filters.queue is not None, after)


@functools.cache
def _statement(
    statuses: frozenset[Status] | None, by_type: bool, by_queue: bool, after: bool
) -> Any:
    # Built once per shape (a few hundred at most): building a union of six branches costs
    # more CPU than the database spends on the page.
    if statuses is None and not by_type and not by_queue:
        # Nothing to narrow by: the primary key, backwards (and the history's id index).
        branches = [_branch(None, by_type, by_queue, after)]
    else:
        branches = [
            _branch(status, by_type, by_queue, after) for status in sorted(statuses or Status)
        ]
    if statuses is None or Status.COMPLETED in statuses:
        branches.append(_history_branch(by_type, by_queue, after))
    if len(branches) == 1:
        return branches[0]
    merged = sa.union_all(*branches).subquery("page")
    return sa.select(merged).order_by(merged.c.id.desc()).limit(sa.bindparam("limit"))


def _branch(status: Status | None, by_type: bool, by_queue: bool, after: bool) -> Any:
    query = sa.select(*JOB_COLUMNS)
    order = [c.id.desc()]
    if status is Status.PROCESSING:
        # A literal: the planner must see it to use the partial lease index.
        query = query.where(c.status == status_literal(status))
    elif status is not None:
        # Literals, and a range rather than `=`: the planner then keeps `status` as a sort
        # column (an equality would make it a constant), so the list indexes, which end in
        # (status, id), are the only paths that return the order asked for. With `=` it
        # prefers the primary key for a common status (id follows the table's physical order
        # exactly), filtering rows until the page is full: for a small queue or type, or a
        # generic plan, that reads most of the table.
        query = query.where(c.status.between(status_literal(status), status_literal(status)))
        order = [c.status.desc(), c.id.desc()]
    if by_type:
        query = query.where(c.type == sa.bindparam("type"))
    if by_queue:
        query = query.where(c.queue == sa.bindparam("queue"))
    if after:
        query = query.where(c.id < sa.bindparam("before"))
    return query.order_by(*order).limit(sa.bindparam("limit"))


def _history_branch(by_type: bool, by_queue: bool, after: bool) -> Any:
    # Completed jobs moved out of `jobs` (`jobcore.history`), each leaf read backwards through
    # the index that leads with the filter given, the leaves merged. The status is checked
    # all the same: the table holds completed jobs only, but this release lists as
    # completed nothing else, whatever a later one moves there.
    # The filter that leads the index is a range, in the sort, as the status is above: so
    # the index is the only path in that order, also for a common type.
    query = sa.select(*HISTORY_COLUMNS).where(h.status == status_literal(Status.COMPLETED))
    order = [h.id.desc()]
    if by_type:
        query = query.where(h.type.between(sa.bindparam("type"), sa.bindparam("type")))
        order = [h.type.desc(), h.id.desc()]
    if by_queue:
        if by_type:
            query = query.where(h.queue == sa.bindparam("queue"))
        else:
            query = query.where(h.queue.between(sa.bindparam("queue"), sa.bindparam("queue")))
            order = [h.queue.desc(), h.id.desc()]
    if after:
        query = query.where(h.id < sa.bindparam("before"))
    return query.order_by(*order).limit(sa.bindparam("limit"))


_CUSTOM_PLAN = sa.text("SELECT set_config('plan_cache_mode', 'force_custom_plan', true)")


async def list_jobs(
    conn: AsyncConnection, filters: Filters, limit: int, before: UUID | None
) -> tuple[list[Job], UUID | None]:
    """Up to `limit` jobs matching `filters`, newest first, below `before` if given; and the
    id to continue from (None on the last page)."""
    statement = list_statement(filters, after=before is not None)
    values: dict[str, Any] = {"limit": limit + 1, "type": filters.type, "queue": filters.queue}
    if before is not None:
        values["before"] = before
    # Planned with the values, each time: the generic plan a prepared statement falls back
    # to guesses a type's or queue's share of a status and may read the status index
    # instead of the list index that leads with the filter (a scan of every such row). The
    # setting lasts for a transaction: on a connection that commits each statement on its
    # own (the API's), the two run in one of their own.
    if conn.in_transaction():
        await conn.execute(_CUSTOM_PLAN)
        rows = (await conn.execute(statement, values)).mappings().all()
    else:
        conn = await conn.execution_options(isolation_level="READ COMMITTED")
        async with conn.begin():
            await conn.execute(_CUSTOM_PLAN)
            rows = (await conn.execute(statement, values)).mappings().all()
    found = [job_from_row(row) for row in rows[:limit]]
    more = len(rows) > limit
    return found, (found[-1].id if more else None)


# --- queue depths ---------------------------------------------------------------
#
# Per queue: due and scheduled pending jobs and their oldest due time (index-only reads of
# the pending rows in `jobs_claim_queue_idx`, per priority present), processing jobs (the
# leased rows in `jobs_lease_idx`) and dead letters (a range of `jobs_queue_idx`). The
# queues are found as loose index scans of `jobs_queue_idx` and `jobs_history_queue_idx`
# (one probe per queue and leaf, whatever they hold) and among the leased rows: no finished
# row is read to count anything.
#
# Read from the head, as `GET /queues` reads them, a held MVCC horizon makes each count
# visit every dead entry it keeps. The worker's gauges read from their floors
# (`jobcore.floors.CountFloors`): the queues they know (`jobcore.queries.present`), per
# queue and priority the `run_at` to start from (`:floor_queues`, `:floor_priorities`,
# `:floors`, as a claim's, with the priorities found as a claim finds them), the lease to
# start from (`:lease_floor`); and each row says where it found the first live jobs
# (`priorities`, `firsts`, `running`, as `jobcore.floors.Counted`).
_PENDING = f"'{Status.PENDING.value}'"
_PROCESSING = f"'{Status.PROCESSING.value}'"
_DEAD_LETTER = f"'{Status.DEAD_LETTER.value}'"
QUEUE_GET_DEPTHS = sa.text(
    f"""
WITH RECURSIVE {QUEUES_LISTED},
{queues_present("in_jobs", "jobqueue.jobs", f"status <> {_PROCESSING}")},
{queues_present("in_history", "jobqueue.jobs_history")},
running AS MATERIALIZED (
    SELECT queue, count(*) AS n, least(min(locked_until), now()) AS first
    FROM jobqueue.jobs
    WHERE status = {_PROCESSING} AND locked_until >= {from_micros("lease_floor")}
    GROUP BY queue
), queues AS (
    SELECT queue FROM in_jobs
    UNION
    SELECT queue FROM in_history
    UNION
    SELECT queue FROM running
)
SELECT w.queue, coalesce(p.pending, 0) AS pending, coalesce(p.scheduled, 0) AS scheduled,
       coalesce(r.n, 0) AS processing,
       (SELECT count(*) FROM jobqueue.jobs
        WHERE status = {_DEAD_LETTER} AND queue = w.queue) AS dead_letter,
       coalesce(extract(epoch FROM now() - p.oldest_due), 0)::float8
           AS oldest_pending_age_seconds,
       coalesce(p.priorities, '{{}}') AS priorities, coalesce(p.firsts, '{{}}') AS firsts,
       {micros("coalesce(r.first, now())")} AS running
FROM queues AS w
LEFT JOIN running AS r ON r.queue = w.queue
CROSS JOIN LATERAL ({PRIORITIES}
    SELECT CAST(sum(x.pending) AS bigint) AS pending,
           CAST(sum(x.scheduled) AS bigint) AS scheduled,
           min(x.oldest_due) AS oldest_due,
           array_agg(priorities.p ORDER BY priorities.p DESC) AS priorities,
           array_agg(x.first ORDER BY priorities.p DESC) AS firsts
    FROM priorities CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE run_at <= now()) AS pending,
               count(*) FILTER (WHERE run_at > now()) AS scheduled,
               min(run_at) FILTER (WHERE run_at <= now()) AS oldest_due,
               {micros("least(min(run_at), now())")} AS first
        FROM jobqueue.jobs
        WHERE status = {_PENDING} AND queue = w.queue AND priority = priorities.p
          AND run_at >= {FLOOR}
    ) AS x
    WHERE priorities.p IS NOT NULL
) AS p
ORDER BY w.queue"""
).columns(
    sa.column("queue", sa.Text),
    sa.column("pending", sa.BigInteger),
    sa.column("scheduled", sa.BigInteger),
    sa.column("processing", sa.BigInteger),
    sa.column("dead_letter", sa.BigInteger),
    sa.column("oldest_pending_age_seconds", sa.Float),
    sa.column("priorities", pg.ARRAY(sa.SmallInteger)),
    sa.column("firsts", pg.ARRAY(sa.BigInteger)),
    sa.column("running", sa.BigInteger),
)
# The parameters of a read from the head.
FROM_THE_HEAD: dict[str, Any] = {
    "known_queues": [],
    "floor_queues": [],
    "floor_priorities": [],
    "floors": [],
    "lease_floor": None,
}


@dataclass(frozen=True)
class QueueDepth:
    queue: str
    pending: int  # due
    scheduled: int  # pending, not due yet
    processing: int
    dead_letter: int
    oldest_pending_age_seconds: float  # of the oldest due job, since it became due; 0: none


DEPTH_STATUSES: Sequence[str] = ("pending", "scheduled", "processing", "dead_letter")


async def queue_depths(conn: AsyncConnection) -> list[QueueDepth]:
    """Every queue that holds jobs, by name."""
    rows = await conn.execute(QUEUE_GET_DEPTHS, FROM_THE_HEAD)
    return [depth_from_row(row) for row in rows.mappings()]


def depth_from_row(row: Any) -> QueueDepth:
    return QueueDepth(**{name: row[name] for name in QueueDepth.__dataclass_fields__})


def counted_from_row(row: Any) -> Counted:
    """Where the read of this row found its queue's first live jobs."""
    return Counted(row["queue"], row["priorities"], row["firsts"], row["running"])


# --- jobs finished per minute -----------------------------------------------------------
#
# The dashboard's chart: for each minute of the last hour (the current minute and the 59
# before it, on the database clock, every one of them present) and each finished status,
# how many jobs finished; a minute without any has one row with status and count NULL. A
# range read of `jobs_finished_idx` over that hour, and of the hour's leaves of
# `jobs_history_finished_idx`: its cost follows the hour's throughput,
# never the table's size. A job retried since it finished has no `finished_at` any more and
# is not counted.
CHART_MINUTES = 60
# Written out where it is used (not a parameter or a subquery), so the planner knows how
# recent a range it is and picks the index.
_FIRST_MINUTE = f"date_trunc('minute', now()) - interval '{CHART_MINUTES - 1} minutes'"
JOB_COUNT_FINISHED_PER_MINUTE = sa.text(
    f"""
WITH finished AS (
    SELECT date_trunc('minute', finished_at) AS minute, status, count(*) AS n
    FROM (SELECT finished_at, status FROM jobqueue.jobs WHERE finished_at >= {_FIRST_MINUTE}
          UNION ALL
          SELECT finished_at, status FROM jobqueue.jobs_history
          WHERE finished_at >= {_FIRST_MINUTE}) AS hour_
    GROUP BY 1, 2
)
SELECT m.minute, f.status, f.n AS finished
FROM generate_series({_FIRST_MINUTE}, date_trunc('minute', now()), interval '1 minute')
    AS m(minute)
LEFT JOIN finished AS f ON f.minute = m.minute
ORDER BY m.minute, f.status"""
).columns(
    sa.column("minute", sa.DateTime(timezone=True)),
    sa.column("status", sa.Text),
    sa.column("finished", sa.BigInteger),
)


# --- each queue's last hour ----------------------------------------------------------------
#
# The dashboard's per-queue charts: for each queue and each minute of the last hour (every one
# present), the jobs finished in it and the age, at the minute's end (now, for the current
# minute), of the queue's oldest job that was due and not finished then (waiting, or running:
# when an attempt started is not stored). A job finished in a minute after `m` was unfinished
# at `m`'s end, so each minute's oldest is the least `run_at` of the jobs finished in a later
# minute and of the jobs unfinished now, if it is not after the minute's end. The reads: the
# hour's range of `jobs_finished_idx` (as the chart above), and the pending and running jobs
# (as `QUEUE_GET_DEPTHS`).
QUEUE_GET_HOUR = sa.text(
    f"""
WITH finished AS (
    SELECT queue, date_trunc('minute', finished_at) AS minute, count(*) AS n,
           min(run_at) AS oldest
    FROM (SELECT queue, finished_at, run_at FROM jobqueue.jobs
          WHERE finished_at >= {_FIRST_MINUTE}
          UNION ALL
          SELECT queue, finished_at, run_at FROM jobqueue.jobs_history
          WHERE finished_at >= {_FIRST_MINUTE}) AS hour_
    GROUP BY 1, 2
), unfinished AS (
    SELECT queue, min(oldest) AS oldest FROM (
        SELECT queue, min(run_at) AS oldest FROM jobqueue.jobs
        WHERE status = {_PENDING} GROUP BY queue
        UNION ALL
        SELECT queue, min(run_at) FROM jobqueue.jobs
        WHERE status = {_PROCESSING} GROUP BY queue
    ) AS both_ GROUP BY queue
), queues AS (
    SELECT queue FROM finished UNION SELECT queue FROM unfinished
), grid AS (
    SELECT q.queue, m.minute, least(m.minute + interval '1 minute', now()) AS at_end,
           coalesce(f.n, 0) AS finished,
           least(
               min(f.oldest) OVER (
                   PARTITION BY q.queue ORDER BY m.minute DESC
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
               ),
               u.oldest
           ) AS oldest
    FROM queues AS q
    CROSS JOIN generate_series({_FIRST_MINUTE}, date_trunc('minute', now()), interval '1 minute')
        AS m(minute)
    LEFT JOIN finished AS f ON f.queue = q.queue AND f.minute = m.minute
    LEFT JOIN unfinished AS u ON u.queue = q.queue
)
SELECT queue, minute, finished,
       CASE WHEN oldest <= at_end THEN extract(epoch FROM at_end - oldest) ELSE 0 END::float8
           AS oldest_pending_age_seconds
FROM grid
ORDER BY queue, minute"""
).columns(
    sa.column("queue", sa.Text),
    sa.column("minute", sa.DateTime(timezone=True)),
    sa.column("finished", sa.BigInteger),
    sa.column("oldest_pending_age_seconds", sa.Float),
)

# The jobs of the given idempotency keys (`jobs_idempotency_key_idx`): the schedules page
# finds each periodic schedule's latest job by the keys of its last ticks.
JOB_FIND_BY_KEYS = (
    sa.select(c.id, c.idempotency_key, c.status, c.created_at)
    .where(c.idempotency_key == sa.any_(sa.bindparam("keys", type_=pg.ARRAY(sa.Text))))
    .order_by(c.idempotency_key)
)


# By their SQL name, for `jobcore.queries.named()`: the depths, the charts, the jobs by key
# (the lists are built per filter, `list_statement`).
NAMED = {
    "queue_get_depths": QUEUE_GET_DEPTHS,
    "job_count_finished_per_minute": JOB_COUNT_FINISHED_PER_MINUTE,
    "queue_get_hour": QUEUE_GET_HOUR,
    "job_find_by_keys": JOB_FIND_BY_KEYS,
}
