"""The statements that read jobs one at a time or count them (the API's), and the wake-up."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from jobcore.queries.common import NOTIFY_CHANNEL, c, status_literal
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
# queue holding millions costs no more than one at its cap). Index-only reads of
# `jobs_claim_queue_idx`, which holds exactly the pending rows, queue first: the listed
# queues, and with a cap for every other queue (`others`), each queue present among the
# pending jobs, found as a loose index scan (one probe per queue).
JOB_COUNT_PENDING = sa.text(
    f"""
WITH RECURSIVE present(queue) AS (
    (SELECT queue FROM jobqueue.jobs WHERE status = {status_literal(Status.PENDING)}
       AND CAST(:others AS bigint) IS NOT NULL
     ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT queue FROM jobqueue.jobs WHERE status = {status_literal(Status.PENDING)}
              AND queue > present.queue ORDER BY queue LIMIT 1)
    FROM present WHERE present.queue IS NOT NULL
), capped(queue, cap) AS (
    SELECT * FROM unnest(CAST(:queues AS text[]), CAST(:caps AS bigint[]))
    UNION ALL
    SELECT queue, CAST(:others AS bigint) FROM present
    WHERE queue IS NOT NULL AND queue <> ALL(CAST(:queues AS text[]))
)
SELECT capped.queue, (
    SELECT count(*) FROM (
        SELECT 1 FROM jobqueue.jobs
        WHERE status = {status_literal(Status.PENDING)} AND jobs.queue = capped.queue
        LIMIT capped.cap
    ) AS p
) AS pending
FROM capped"""
)


JOB_FIND_KEYS = sa.select(c.idempotency_key).where(
    c.idempotency_key == sa.any_(sa.bindparam("keys", type_=pg.ARRAY(sa.Text)))
)


# --- wake-ups -----------------------------------------------------------------

JOB_NOTIFY = sa.select(sa.func.pg_notify(sa.literal(NOTIFY_CHANNEL), sa.literal("")))
