"""The claim under per-type limits (TYPE_CONCURRENCY, TYPE_RATE): `JOB_LOCK_TYPES` and
`JOB_CLAIM_LIMITED`, in a transaction of their own."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from jobcore.queries.common import c
from jobcore.queries.job_claim import (
    CLAIMED_COLUMNS,
    FLOOR,
    KEY,
    KEY_LEASE_FLOOR,
    PRIORITIES,
    known,
    priorities,
)
from jobcore.rows import Claimed
from jobcore.states import Operation, Status

(_CLAIMABLE,) = Operation.CLAIM.sources
_PENDING = f"'{_CLAIMABLE.value}'"

# With limits configured, the ordinary claims skip the limited types (`:limited`), and those
# are claimed only by JOB_CLAIM_LIMITED, in a transaction of its own: JOB_LOCK_TYPES first
# takes a transaction-scoped advisory lock per limited type (in key order, so two claimers
# cannot deadlock), then JOB_CLAIM_LIMITED, a new statement whose snapshot sees every claim
# committed before the lock, counts what each type has left and claims at most that. Only
# claimers of the same types wait for each other; other types' claims never take the locks.

# The same round trip sets, for the transaction only, what JOB_CLAIM_LIMITED's plan needs: its
# window functions sort (a worker transaction turns sorts off, and their penalty in the cost
# would bring in JIT compilation, 100s of ms per claim; JIT is kept off by its cost threshold,
# as in the worker's transactions, see jobqueue_worker.database).
JOB_LOCK_TYPES = sa.text(
    """
SELECT set_config('enable_sort', 'on', true) AS sort,
       set_config('jit_above_cost', '-1', true) AS jit,
       count(pg_advisory_xact_lock(k)) AS locked
FROM (
    SELECT DISTINCT hashtextextended('jobqueue.type:' || t, 0) AS k
    FROM unnest(CAST(:types AS text[])) AS t
    ORDER BY k
) AS keys"""
).columns(sa.column("sort", sa.Text), sa.column("jit", sa.Text), sa.column("locked", sa.BigInteger))

_PROCESSING = f"'{Status.PROCESSING.value}'"

# The limited types' claim floors (`jobcore.floors.TypeFloors`), per type, queue and
# priority: a type's due jobs are read in `jobs_claim_type_idx` from its floors, as JOB_CLAIM
# reads the other types' from theirs, with the priorities found the same way.
_TYPE_KNOWN = known(
    """unnest(CAST(:type_floor_types AS text[]),
                    CAST(:type_floor_queues AS text[]),
                    CAST(:type_floor_priorities AS smallint[]),
                    CAST(:type_floors AS bigint[])) AS k(t, q, p, f)""",
    "k.t = room.type AND k.q = w.queue",
)
_TYPE_PRIORITIES = priorities(
    _TYPE_KNOWN, f"status = {_PENDING} AND type = room.type AND queue = w.queue"
)
# The claim of the limited types, for the free slots of every queue, ranked by priority
# against the other types' due jobs (a low-priority limited backlog never takes a slot a
# higher-priority job of another type is due for; at equal priority the limited ones come
# first, as they can only be claimed here): those it outranks are left to the
# ordinary claim that follows (`JOB_CLAIM_UNLIMITED`), so this transaction, serialised with
# the other claimers of the same types by their advisory locks, locks none of them. Per
# limited type, the jobs it may still start: its concurrency limit less its processing jobs
# (read through the lease index: only leased rows, from the type's lease floor,
# `:lease_floors`, below which no running job's lease lies, see `jobcore.floors.TypeFloors`;
# its row returns the earliest such lease as `running`) and less its handlers that outlived their
# recorded attempts in this process (`overruns`: they still hold their unit until they
# return), its rate less what its current window used; NULL where it has no such limit.
# The candidates: per queue and limited type, the due jobs in claim order (a loose index
# scan over priorities, as in JOB_CLAIM, in `jobs_claim_type_idx`, from the type's floors),
# at most what the type
# has left and the queue's free slots, of which at most what each type has left; and per
# queue, read without a lock, the first free-slots due jobs of the other types of a
# priority above the lowest limited candidate's, as JOB_CLAIM finds the priorities (from the
# floors), in any order (they only rank: in index order, keys first). Keys do not order the
# limited types' jobs, but KEY_CONCURRENCY (`key_limits`, per queue) limits them as in
# JOB_CLAIM: per queue with a limit, each key's use (`key_use`: its running jobs, read once
# from the key lease floor, `KEY_LEASE_FLOOR`, and the claimer's overrunning handlers of the
# key: `overrun_queues`, `overrun_keys`,
# `overrun_counts`); the keys at their limit are read past, so a full key's backlog does not
# take the candidates' places; of another key's candidates, the first in claim order within
# what it has left are taken. The transaction then also holds
# the queue's lock (`JOB_LOCK_KEYS`, after the types' locks), so these counts see every claim
# committed before.
# Of the limited candidates, those among each queue's first free-slots candidates in that
# order are taken. The rate windows of the
# types that started jobs are advanced. Rows: a claimed job (columns as JOB_CLAIM's, then
# NULL, NULL), or per limited type (id NULL) the type, the limit it reached (`held`,
# 'rate' or 'concurrency', NULL if none) and the seconds until its rate window ends.
# The claimed job's columns, as `Claimed` lists them; the rows about a type (id NULL) hold
# the type in the `type` column and NULL in the others.
_RETURNED = ", ".join(Claimed.__dataclass_fields__)
_NO_JOB = ", ".join(
    "room.type" if name == "type" else "NULL" for name in Claimed.__dataclass_fields__
)
JOB_CLAIM_LIMITED = sa.text(
    f"""
WITH room AS MATERIALIZED (
    SELECT l.type, l.rate, l.period, r.window_start,
           l.concurrency - l.overrun - running.n AS concurrency_left,
           l.rate - coalesce((SELECT used FROM jobqueue.job_rate_windows AS u
                              WHERE u.type = l.type AND u.window_start = r.window_start),
                             0) AS rate_left,
           least(running.first, now()) AS running
    FROM unnest(CAST(:types AS text[]), CAST(:concurrency AS integer[]),
                CAST(:overruns AS integer[]), CAST(:rates AS integer[]),
                CAST(:periods AS float8[]), CAST(:lease_floors AS bigint[]))
         AS l(type, concurrency, overrun, rate, period, lease_floor)
    CROSS JOIN LATERAL (
        SELECT to_timestamp(floor(extract(epoch FROM statement_timestamp()) / l.period)
                            * l.period) AS window_start
    ) AS r
    CROSS JOIN LATERAL (
        SELECT count(*) AS n, min(locked_until) AS first FROM jobqueue.jobs
        WHERE status = {_PROCESSING} AND type = l.type
          AND locked_until >= coalesce(CAST('epoch' AS timestamptz)
                                       + l.lease_floor * INTERVAL '1 microsecond',
                                       CAST('-infinity' AS timestamptz))
    ) AS running
), key_use AS MATERIALIZED (
    SELECT w.queue, u.k, sum(u.n) AS used
    FROM unnest(CAST(:queues AS text[]), CAST(:key_limits AS integer[])) AS w(queue, key_limit)
    CROSS JOIN LATERAL (
        SELECT r.concurrency_key AS k, 1 AS n FROM jobqueue.jobs AS r
        WHERE r.status = {_PROCESSING} AND r.queue = w.queue AND r.concurrency_key IS NOT NULL
          AND r.locked_until >= {KEY_LEASE_FLOOR}
        UNION ALL
        SELECT o.k, o.n FROM unnest(CAST(:overrun_queues AS text[]),
                                    CAST(:overrun_keys AS text[]),
                                    CAST(:overrun_counts AS integer[])) AS o(q, k, n)
        WHERE o.q = w.queue
    ) AS u
    WHERE w.key_limit IS NOT NULL
    GROUP BY w.queue, u.k
), queue_limits AS MATERIALIZED (
    SELECT w.queue, w.n, w.key_limit,
           ARRAY(SELECT u.k FROM key_use AS u
                 WHERE u.queue = w.queue AND u.used >= w.key_limit) AS full_keys
    FROM unnest(CAST(:queues AS text[]), CAST(:slots AS integer[]),
                CAST(:key_limits AS integer[])) AS w(queue, n, key_limit)
), due AS MATERIALIZED (
    SELECT d.id, d.priority, d.run_at, d.concurrency_key, room.type, w.queue, w.n AS slots,
           w.key_limit, greatest(least(room.concurrency_left, room.rate_left), 0) AS type_left
    FROM room CROSS JOIN queue_limits AS w
    CROSS JOIN LATERAL ({_TYPE_PRIORITIES}
        SELECT j.id, j.priority, j.run_at, j.concurrency_key FROM priorities CROSS JOIN LATERAL (
            SELECT id, priority, run_at, concurrency_key FROM jobqueue.jobs
            WHERE status = {_PENDING} AND type = room.type AND queue = w.queue
              AND priority = priorities.p AND run_at <= now() AND run_at >= {FLOOR}
              AND (concurrency_key IS NULL OR concurrency_key <> ALL(w.full_keys))
            ORDER BY run_at, id
            LIMIT greatest(least(room.concurrency_left, room.rate_left, w.n), 0)
            FOR UPDATE SKIP LOCKED
        ) AS j
        WHERE priorities.p IS NOT NULL
        LIMIT greatest(least(room.concurrency_left, room.rate_left, w.n), 0)
    ) AS d
), keyed AS (
    SELECT due.*,
           row_number() OVER (PARTITION BY queue, concurrency_key
                              ORDER BY priority DESC, run_at, id) AS nth_key,
           CASE WHEN concurrency_key IS NOT NULL THEN
               key_limit - coalesce((SELECT u.used FROM key_use AS u
                                     WHERE u.queue = due.queue AND u.k = due.concurrency_key), 0)
           END AS key_left
    FROM due
), by_type AS (
    SELECT id, priority, run_at, queue, slots,
           row_number() OVER (PARTITION BY type ORDER BY priority DESC, run_at, id) AS nth,
           type_left
    FROM keyed WHERE key_left IS NULL OR nth_key <= key_left
), others AS MATERIALIZED (
    SELECT o.id, o.priority, o.run_at, w.queue, w.n AS slots
    FROM unnest(CAST(:queues AS text[]), CAST(:slots AS integer[])) AS w(queue, n)
    CROSS JOIN LATERAL ({PRIORITIES}
        SELECT d.id, d.priority, d.run_at FROM priorities CROSS JOIN LATERAL (
            SELECT id, priority, run_at FROM jobqueue.jobs
            WHERE status = {_PENDING} AND queue = w.queue AND priority = priorities.p
              AND run_at <= now() AND type <> ALL(CAST(:types AS text[]))
              -- Only a higher priority outranks a limited candidate: nothing to read at
              -- or below the lowest one's (or at all, in a queue without candidates).
              AND priority > (SELECT coalesce(min(c.priority), 32767) FROM due AS c
                              WHERE c.queue = w.queue)
            -- Any of them will do (they only rank): in index order, keys first.
            ORDER BY {KEY}, run_at, id LIMIT w.n
        ) AS d
        LIMIT w.n
    ) AS o
), by_queue AS (
    SELECT id, slots, limited,
           row_number() OVER (PARTITION BY queue ORDER BY priority DESC, limited DESC, run_at, id)
           AS nth
    FROM (SELECT id, priority, run_at, queue, slots, true AS limited FROM by_type
          WHERE nth <= type_left
          UNION ALL
          SELECT id, priority, run_at, queue, slots, false FROM others) AS candidates
), claimed AS (
    UPDATE jobqueue.jobs SET status = {_PROCESSING}, attempts = attempts + 1,
        lease_token = lease_token + 1,
        locked_until = now() + CAST(:lease_seconds AS float8) * interval '1 second',
        claim_id = CAST(:claim AS uuid), leased_by = CAST(:holder AS text), updated_at = now()
    WHERE id = ANY(ARRAY(SELECT id FROM by_queue WHERE nth <= slots AND limited))
    RETURNING {_RETURNED}
), started AS (
    SELECT type, count(*) AS n FROM claimed GROUP BY type
), counted AS (
    INSERT INTO jobqueue.job_rate_windows AS u (type, window_start, used)
    SELECT room.type, room.window_start, started.n
    FROM room JOIN started ON started.type = room.type
    WHERE room.rate IS NOT NULL
    ON CONFLICT (type) DO UPDATE SET
        used = CASE WHEN u.window_start = excluded.window_start
                    THEN u.used + excluded.used ELSE excluded.used END,
        window_start = excluded.window_start
)
SELECT {_RETURNED}, CAST(NULL AS text) AS held, CAST(NULL AS float8) AS wait,
       CAST(NULL AS bigint) AS running
FROM claimed
UNION ALL
SELECT {_NO_JOB},
       CASE WHEN room.rate_left - coalesce(started.n, 0) <= 0 THEN 'rate'
            WHEN room.concurrency_left - coalesce(started.n, 0) <= 0 THEN 'concurrency'
       END,
       extract(epoch FROM room.window_start + room.period * interval '1 second'
                          - statement_timestamp())::float8,
       CAST(extract(epoch FROM room.running) * 1000000 AS bigint)
FROM room LEFT JOIN started ON started.type = room.type"""
).columns(
    sa.column("id", pg.UUID(as_uuid=True)),
    *(sa.column(name, c[name].type) for name in CLAIMED_COLUMNS),
    sa.column("held", sa.Text),
    sa.column("wait", sa.Float),
    sa.column("running", sa.BigInteger),
)
