"""The claims: leasing due jobs in claim order (`JOB_CLAIM`, from the claim floors), with the
completions that free their slots (`JOB_COMPLETE_AND_CLAIM`), under per-type limits
(`JOB_CLAIM_LIMITED`), and the reads beside them (`JOB_NEXT_DUE`, `JOB_CLAIM_HEADS`)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from jobcore.queries.common import ONE_SECOND, c, status_literal
from jobcore.queries.job_outcome import JOB_SET_OUTCOME
from jobcore.rows import Claimed
from jobcore.schema import jobs
from jobcore.states import Operation, Status

# --- the worker's statements ------------------------------------------------
#
# Constructs only: the worker runs them through `jobcore.compiled`, and so do the
# tests, so every transition test exercises the path production takes.

# The claim order, per queue: priority descending, then run_at, then id, among due jobs.
# `jobs_claim_queue_idx` holds pending jobs in that order, but a plain `run_at <= now()`
# filter on it would read past every job not yet due at a higher priority (each claim,
# each poll). So the claim walks it as a loose index scan: the priorities present among a
# queue's pending jobs, highest first (one index probe each, a recursive CTE), and for each
# the due jobs in run_at order (a range read that stops at the first job not yet due),
# until it has as many as that queue's free slots. Guards are literals from the
# declaration, as everywhere (the planner must see them to use the partial index).
#
# Both reads start past what the claiming process already took (`jobcore.floors`): the
# priorities it knows, each with its floor (`known`: parameters `floor_queues`,
# `floor_priorities`, `floors`), are read from their floor, and only the gaps between them
# are probed for priorities it does not know yet. Without floors (a sweep) this is the
# plain loose index scan from the head. The dead entries a held MVCC horizon keeps in the
# index lie below the floors, so no claim but a sweep reads them.
(_CLAIMABLE,) = Operation.CLAIM.sources
_PENDING = f"'{_CLAIMABLE.value}'"
_NO_PRIORITY = -32768  # below every priority: "no known priority below this one"
_KNOWN = """
    known(p, f) AS (
        SELECT k.p, k.f FROM unnest(CAST(:floor_queues AS text[]),
                                    CAST(:floor_priorities AS smallint[]),
                                    CAST(:floors AS timestamptz[])) AS k(q, p, f)
        WHERE k.q = w.queue
    )"""


def _next_priority(above: str, known_below: str) -> str:
    """The next priority present below `above` (SQL, NULL: the top): the highest pending
    one in the gap down to the next known priority, else that known priority."""
    bound = f" AND priority < {above}" if above else ""
    return f"""coalesce(
            (SELECT priority FROM jobqueue.jobs
             WHERE status = {_PENDING} AND queue = w.queue{bound}
               AND priority > (SELECT coalesce(max(known.p), {_NO_PRIORITY}) FROM known
                               {known_below})
             ORDER BY priority DESC LIMIT 1),
            (SELECT max(known.p) FROM known {known_below}))"""


_PRIORITIES = f"""
    WITH RECURSIVE {_KNOWN.strip()}, priorities(p) AS (
        SELECT {_next_priority("", "")}
        UNION ALL
        SELECT {_next_priority("priorities.p", "WHERE known.p < priorities.p")}
        FROM priorities WHERE priorities.p IS NOT NULL
    )"""
_FLOOR = (
    "coalesce((SELECT known.f FROM known WHERE known.p = priorities.p),"
    " CAST('-infinity' AS timestamptz))"
)


def _due_jobs(skip: str) -> Any:
    """The jobs a claim takes; `skip` is a further condition on them ("" for none)."""
    return (
        sa.text(
            f"""
SELECT j.id FROM unnest(CAST(:queues AS text[]), CAST(:slots AS integer[])) AS w(queue, n)
CROSS JOIN LATERAL ({_PRIORITIES}
    SELECT d.id FROM priorities CROSS JOIN LATERAL (
        SELECT id FROM jobqueue.jobs
        WHERE status = {_PENDING} AND queue = w.queue AND priority = priorities.p
          AND run_at >= {_FLOOR} AND run_at <= now(){skip}
        ORDER BY run_at, id LIMIT w.n FOR UPDATE SKIP LOCKED
    ) AS d
    LIMIT w.n
) AS j"""
        )
        .columns(sa.column("id", pg.UUID(as_uuid=True)))
        .cte("due")
        .prefix_with("MATERIALIZED")
    )


# The rows `due` locked are pending and stay so until the statement ends (nobody else
# can change a locked row), so the UPDATE finds them by id alone. Testing the status
# again here would let the planner reach them through the claim index instead, which it
# may take for nearly empty (statistics from a quiet moment): every pending job read per
# claimed one, 100s of ms per claim with 20,000 waiting. `= ANY(ARRAY(...))` keeps the
# lookup on the primary key in generic plans too, whatever the statistics say.
def _claim(due: Any) -> Any:
    return (
        sa.update(jobs)
        .where(c.id == sa.any_(sa.func.array(sa.select(due.c.id).scalar_subquery())))
        .values(
            status=status_literal(Status.PROCESSING),
            attempts=c.attempts + 1,
            lease_token=c.lease_token + 1,
            locked_until=sa.func.now() + sa.bindparam("lease_seconds", type_=sa.Float) * ONE_SECOND,
            # Not named after the column: SQLAlchemy would add `SET claim_id` to every UPDATE of
            # a statement whose parameters hold a column's name.
            claim_id=sa.bindparam("claim", type_=pg.UUID(as_uuid=True)),
            leased_by=sa.bindparam("holder", type_=sa.Text),
            updated_at=sa.func.now(),
        )
        .returning(*(c[name] for name in Claimed.__dataclass_fields__))
    )


JOB_CLAIM = _claim(_due_jobs(""))

# Seconds until the earliest pending job of these queues that is not due yet (NULL: none),
# so an idle worker can wake for it instead of polling fast: per queue and priority, the
# first entry past now() in the claim index. The priorities are found as the claim finds
# them, from the same floors.
JOB_NEXT_DUE = sa.text(
    f"""
SELECT EXTRACT(EPOCH FROM min(n.run_at) - now())::float8 AS seconds
FROM unnest(CAST(:queues AS text[])) AS w(queue)
CROSS JOIN LATERAL ({_PRIORITIES}
    SELECT (SELECT run_at FROM jobqueue.jobs
            WHERE status = {_PENDING} AND queue = w.queue AND priority = priorities.p
              AND run_at > now()
            ORDER BY run_at LIMIT 1) AS run_at
    FROM priorities WHERE priorities.p IS NOT NULL
) AS n"""
).columns(sa.column("seconds", sa.Float))


# Per queue and priority present, the earliest due pending job's run_at, found from the
# head of the claim index (without floors: `known` empty), locking nothing: what a process
# checks its floors against now and then, off the claims' path (`jobcore.floors`). Under a
# held MVCC horizon it reads every dead entry, as a claim from the head would.
JOB_CLAIM_HEADS = sa.text(
    f"""
SELECT w.queue, h.p AS priority, h.run_at
FROM unnest(CAST(:queues AS text[])) AS w(queue)
CROSS JOIN LATERAL ({_PRIORITIES}
    SELECT priorities.p, (SELECT run_at FROM jobqueue.jobs
                          WHERE status = {_PENDING} AND queue = w.queue
                            AND priority = priorities.p AND run_at <= now()
                          ORDER BY run_at, id LIMIT 1) AS run_at
    FROM priorities WHERE priorities.p IS NOT NULL
) AS h
WHERE h.run_at IS NOT NULL"""
).columns(
    sa.column("queue", sa.Text),
    sa.column("priority", sa.SmallInteger),
    sa.column("run_at", sa.DateTime(timezone=True)),
)


# COMPLETE and JOB_CLAIM in one statement, so a worker refills the slots its completed jobs
# free with the same round trip and commit (WAL flush) that records them. Each transition
# is still its own guarded UPDATE. COMPLETE runs first (the first branch is read first);
# JOB_CLAIM never waits (SKIP LOCKED), so while the statement waits for a lock it holds no
# lock of its claim. Both see one snapshot: JOB_CLAIM cannot see what COMPLETE changed, and
# needs not (a job it completes is not pending). Rows, by name: `completed` true with the
# id and lease_token of a completed job (the other columns NULL), or false with the columns
# of a claimed job, as JOB_CLAIM returns them.
_done = JOB_SET_OUTCOME[Operation.COMPLETE].cte("done")
_CLAIMED_COLUMNS = [name for name in Claimed.__dataclass_fields__ if name != "id"]


def _complete_and_claim(claim: Any) -> Any:
    claimed = claim.cte("claimed")
    return sa.union_all(
        sa.select(
            sa.true().label("completed"),
            _done.c.id,
            *(
                _done.c.lease_token
                if name == "lease_token"
                else sa.cast(sa.null(), c[name].type).label(name)
                for name in _CLAIMED_COLUMNS
            ),
        ),
        sa.select(sa.false(), claimed.c.id, *(claimed.c[name] for name in _CLAIMED_COLUMNS)),
    )


JOB_COMPLETE_AND_CLAIM = _complete_and_claim(JOB_CLAIM)


# --- per-type limits (TYPE_CONCURRENCY, TYPE_RATE) -----------------------------------
#
# With limits configured, the claims above skip the limited types (`:limited`), and those
# are claimed only by JOB_CLAIM_LIMITED, in a transaction of its own: JOB_LOCK_TYPES first
# takes a transaction-scoped advisory lock per limited type (in key order, so two claimers
# cannot deadlock), then JOB_CLAIM_LIMITED, a new statement whose snapshot sees every claim
# committed before the lock, counts what each type has left and claims at most that. Only
# claimers of the same types wait for each other; other types' claims never take the locks.

JOB_CLAIM_UNLIMITED = _claim(_due_jobs(" AND type <> ALL(CAST(:limited AS text[]))"))
JOB_COMPLETE_AND_CLAIM_UNLIMITED = _complete_and_claim(JOB_CLAIM_UNLIMITED)

# The same round trip sets, for the transaction only, what JOB_CLAIM_LIMITED's plan needs: its
# window functions sort (a worker session turns sorts off, and their penalty in the cost
# would bring in JIT compilation, 100s of ms per claim).
JOB_LOCK_TYPES = sa.text(
    """
SELECT set_config('enable_sort', 'on', true) AS sort, set_config('jit', 'off', true) AS jit,
       count(pg_advisory_xact_lock(k)) AS locked
FROM (
    SELECT DISTINCT hashtextextended('jobqueue.type:' || t, 0) AS k
    FROM unnest(CAST(:types AS text[])) AS t
    ORDER BY k
) AS keys"""
).columns(sa.column("sort", sa.Text), sa.column("jit", sa.Text), sa.column("locked", sa.BigInteger))

_PROCESSING = f"'{Status.PROCESSING.value}'"
# The claim of the limited types, for the free slots of every queue, ranked by priority
# against the other types' due jobs (a low-priority limited backlog never takes a slot a
# higher-priority job of another type is due for; at equal priority the limited ones come
# first, as they can only be claimed here): those it outranks are left to the
# ordinary claim that follows (`JOB_CLAIM_UNLIMITED`), so this transaction, serialised with
# the other claimers of the same types by their advisory locks, locks none of them. Per
# limited type, the jobs it may still start: its concurrency limit less its processing jobs
# (read through the lease index: only leased rows) and less its handlers that outlived their
# recorded attempts in this process (`overruns`: they still hold their unit until they
# return), its rate less what its current window used; NULL where it has no such limit.
# The candidates: per queue and limited type, the due jobs in claim order (a loose index
# scan over priorities, as in JOB_CLAIM, in `jobs_claim_type_idx`), at most what the type
# has left and the queue's free slots, of which at most what each type has left; and per
# queue, read without a lock, the first free-slots due jobs of the other types of a
# priority above the lowest limited candidate's, as JOB_CLAIM reads them (from the floors).
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
           l.concurrency - l.overrun
           - (SELECT count(*) FROM jobqueue.jobs
              WHERE status = {_PROCESSING} AND type = l.type) AS concurrency_left,
           l.rate - coalesce((SELECT used FROM jobqueue.job_rate_windows AS u
                              WHERE u.type = l.type AND u.window_start = r.window_start),
                             0) AS rate_left
    FROM unnest(CAST(:types AS text[]), CAST(:concurrency AS integer[]),
                CAST(:overruns AS integer[]), CAST(:rates AS integer[]),
                CAST(:periods AS float8[]))
         AS l(type, concurrency, overrun, rate, period)
    CROSS JOIN LATERAL (
        SELECT to_timestamp(floor(extract(epoch FROM statement_timestamp()) / l.period)
                            * l.period) AS window_start
    ) AS r
), due AS MATERIALIZED (
    SELECT d.id, d.priority, d.run_at, room.type, w.queue, w.n AS slots,
           greatest(least(room.concurrency_left, room.rate_left), 0) AS type_left
    FROM room CROSS JOIN unnest(CAST(:queues AS text[]), CAST(:slots AS integer[])) AS w(queue, n)
    CROSS JOIN LATERAL (
        WITH RECURSIVE priorities(p) AS (
            (SELECT priority FROM jobqueue.jobs
             WHERE status = {_PENDING} AND type = room.type AND queue = w.queue
             ORDER BY priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT priority FROM jobqueue.jobs
                    WHERE status = {_PENDING} AND type = room.type AND queue = w.queue
                      AND priority < priorities.p
                    ORDER BY priority DESC LIMIT 1)
            FROM priorities WHERE priorities.p IS NOT NULL
        )
        SELECT j.id, j.priority, j.run_at FROM priorities CROSS JOIN LATERAL (
            SELECT id, priority, run_at FROM jobqueue.jobs
            WHERE status = {_PENDING} AND type = room.type AND queue = w.queue
              AND priority = priorities.p AND run_at <= now()
            ORDER BY run_at, id
            LIMIT greatest(least(room.concurrency_left, room.rate_left, w.n), 0)
            FOR UPDATE SKIP LOCKED
        ) AS j
        LIMIT greatest(least(room.concurrency_left, room.rate_left, w.n), 0)
    ) AS d
), by_type AS (
    SELECT id, priority, run_at, queue, slots,
           row_number() OVER (PARTITION BY type ORDER BY priority DESC, run_at, id) AS nth,
           type_left
    FROM due
), others AS MATERIALIZED (
    SELECT o.id, o.priority, o.run_at, w.queue, w.n AS slots
    FROM unnest(CAST(:queues AS text[]), CAST(:slots AS integer[])) AS w(queue, n)
    CROSS JOIN LATERAL ({_PRIORITIES}
        SELECT d.id, d.priority, d.run_at FROM priorities CROSS JOIN LATERAL (
            SELECT id, priority, run_at FROM jobqueue.jobs
            WHERE status = {_PENDING} AND queue = w.queue AND priority = priorities.p
              AND run_at >= {_FLOOR} AND run_at <= now()
              AND type <> ALL(CAST(:types AS text[]))
              -- Only a higher priority outranks a limited candidate: nothing to read at
              -- or below the lowest one's (or at all, in a queue without candidates).
              AND priority > (SELECT coalesce(min(c.priority), 32767) FROM due AS c
                              WHERE c.queue = w.queue)
            ORDER BY run_at, id LIMIT w.n
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
SELECT {_RETURNED}, CAST(NULL AS text) AS held, CAST(NULL AS float8) AS wait
FROM claimed
UNION ALL
SELECT {_NO_JOB},
       CASE WHEN room.rate_left - coalesce(started.n, 0) <= 0 THEN 'rate'
            WHEN room.concurrency_left - coalesce(started.n, 0) <= 0 THEN 'concurrency'
       END,
       extract(epoch FROM room.window_start + room.period * interval '1 second'
                          - statement_timestamp())::float8
FROM room LEFT JOIN started ON started.type = room.type"""
).columns(
    sa.column("id", pg.UUID(as_uuid=True)),
    *(sa.column(name, c[name].type) for name in _CLAIMED_COLUMNS),
    sa.column("held", sa.Text),
    sa.column("wait", sa.Float),
)
