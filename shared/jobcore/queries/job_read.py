"""The statements that read jobs one at a time or count them (the API's), and the wake-up."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from jobcore.queries.common import NOTIFY_CHANNEL, c, status_literal
from jobcore.queries.job_claim import FLOOR, PRIORITIES
from jobcore.queries.present import QUEUES_LISTED, micros, queues_present
from jobcore.rows import JOB_FIELDS
from jobcore.schema import jobs, jobs_history
from jobcore.states import Status

# --- reads ----------------------------------------------------------------


# The full record: the columns every answer has, and the failed attempts ([] for none). A
# job is in one of the tables: the statement's snapshot sees it before its move or after.
def _get(table: sa.Table) -> sa.Select[Any]:
    t = table.c
    return sa.select(
        *(t[name] for name in JOB_FIELDS),
        sa.func.coalesce(t.errors, sa.literal_column("'[]'::jsonb")).label("errors"),
        t.leased_by,
    ).where(t.id == sa.bindparam("id"))


JOB_GET = sa.union_all(_get(jobs), _get(jobs_history))


# --- admission (the API's MAX_PENDING) ----------------------------------------
#
# Pending jobs per capped queue, due or not, each count stopping at the queue's cap (a
# queue holding millions costs no more than one at its cap), the priorities present read
# highest first, and the earliest pending job of each (one probe). Index-only reads of
# `jobs_claim_queue_idx`, which holds exactly the pending rows, queue first: the listed
# queues, and with a cap for every other queue (`others`), each queue present among the
# pending jobs, found as a loose index scan (one probe per queue). Each API process reads
# from its count floors (`jobcore.floors.CountFloors`) between sweeps, as the worker's
# gauges do (`jobcore.search.QUEUE_GET_DEPTHS`): the queues it knows, per queue and
# priority the `run_at` to start from; and each row says where it found the first pending
# jobs (`priorities`, `firsts`).
_PENDING = status_literal(Status.PENDING)
# A priority's earliest pending job (one probe from its floor), or the count's time.
_FIRST = micros(
    f"""least((SELECT run_at FROM jobqueue.jobs
                  WHERE status = {_PENDING} AND queue = w.queue AND priority = priorities.p
                    AND run_at >= {FLOOR}
                  ORDER BY run_at LIMIT 1), now())"""
)
JOB_COUNT_PENDING = sa.text(
    f"""
WITH RECURSIVE {QUEUES_LISTED},
{
        queues_present(
            "present",
            "jobqueue.jobs",
            f"status = {_PENDING} AND CAST(:others AS bigint) IS NOT NULL",
        )
    },
capped(queue, cap) AS (
    SELECT * FROM unnest(CAST(:queues AS text[]), CAST(:caps AS bigint[]))
    UNION ALL
    SELECT queue, CAST(:others AS bigint) FROM present
    WHERE queue <> ALL(CAST(:queues AS text[])) AND CAST(:others AS bigint) IS NOT NULL
)
SELECT w.queue, coalesce(p.pending, 0) AS pending,
       coalesce(p.priorities, '{{}}') AS priorities, coalesce(p.firsts, '{{}}') AS firsts
FROM capped AS w
CROSS JOIN LATERAL ({PRIORITIES}
    SELECT (SELECT count(*) FROM (
                SELECT 1 FROM priorities AS at CROSS JOIN LATERAL (
                    SELECT 1 FROM jobqueue.jobs
                    WHERE status = {_PENDING} AND queue = w.queue AND priority = at.p
                      AND run_at >= coalesce(at.f, CAST('-infinity' AS timestamptz))
                    LIMIT w.cap
                ) AS j
                LIMIT w.cap
            ) AS n) AS pending,
           array_agg(priorities.p ORDER BY priorities.p DESC) AS priorities,
           array_agg({_FIRST} ORDER BY priorities.p DESC) AS firsts
    FROM priorities
) AS p"""
).columns(
    sa.column("queue", sa.Text),
    sa.column("pending", sa.BigInteger),
    sa.column("priorities", pg.ARRAY(sa.SmallInteger)),
    sa.column("firsts", pg.ARRAY(sa.BigInteger)),
)


JOB_FIND_KEYS = sa.select(c.idempotency_key).where(
    c.idempotency_key == sa.any_(sa.bindparam("keys", type_=pg.ARRAY(sa.Text)))
)


# --- wake-ups -----------------------------------------------------------------

JOB_NOTIFY = sa.select(sa.func.pg_notify(sa.literal(NOTIFY_CHANNEL), sa.literal("")))
