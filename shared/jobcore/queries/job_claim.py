"""The claims: leasing due jobs in claim order (`JOB_CLAIM`, from the claim floors, keys in
turn), with the completions that free their slots (`JOB_COMPLETE_AND_CLAIM`), and the reads
beside them (`JOB_NEXT_DUE`, `JOB_CLAIM_HEADS`, `JOB_LOCK_KEYS`). The claim under per-type
limits is `jobcore.queries.job_claim_limited`'s."""

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

# The claim order, per queue: priority descending; within a priority, the concurrency keys
# in turn (the key-less jobs are key ''); within a key, run_at, then id, among due jobs.
# `jobs_claim_key_idx` holds pending jobs in that order (queue, priority, key, run_at,
# id), but a plain `run_at <= now()` filter on it would read past every job not yet due
# (each claim, each poll). So the claim walks it as a loose index scan: the priorities
# present among a queue's pending jobs, highest first (one index probe each, a recursive
# CTE); for each, the keys present, from the one after the last key this process served
# there (`jobcore.turns`), wrapping round, at most as many as the queue has free slots (one
# probe each; '' counts as present without one); for each key its share of the slots, the
# due jobs in run_at order (a range read that stops at the first job not yet due); then,
# if slots are left and every key had its turn, the rest shared among the keys that filled
# theirs. Guards are literals
# from the declaration, as everywhere (the planner must see them to use the partial index).
#
# The key-less jobs' reads start past what the claiming process already took
# (`jobcore.floors`): the priorities it knows, each with its floor (`known`: parameters
# `floor_queues`, `floor_priorities`, `floors`), are read from their floor, and only the
# gaps between them are probed for priorities it does not know yet. Without floors (a
# sweep) this is the plain loose index scan from the head. The dead entries a held MVCC
# horizon keeps in the index lie below the floors, so no claim but a sweep reads them.
# Likewise the keys it knows, each with its floor (`known_keys`: parameters
# `key_floor_queues`, `key_floor_priorities`, `key_floor_keys`, `key_floors`): a known key
# is looked for, and its jobs read, from its floor, and only the gaps between known keys
# are probed from their head (a probe bounded by the next known key stops at that key's
# first entry, dead or not). A key it does not know is read from its head.
#
# KEY_CONCURRENCY (`key_limits`, per queue, NULL for none): a key's share is at most its
# room, from `key_rooms()` (revision 0016), one call for the first keys in turn (and one
# more for the keys after them, should some have had no room): its limit less the
# claimer's own handlers of the key that outlived their recorded attempts
# (`overrun_queues`, `overrun_keys`, `overrun_counts`), less its running jobs
# (`jobs_key_lease_idx`, from `KEY_LEASE_FLOOR`), counted under the key's own advisory
# lock in a snapshot taken after it, so the count sees every claim of the key committed
# before (and a completion earlier in the same statement); a key another claimer is taking
# jobs of at that moment has no room in this claim. Claimers of different keys never wait
# for each other.
(_CLAIMABLE,) = Operation.CLAIM.sources
_PENDING = f"'{_CLAIMABLE.value}'"
_NO_PRIORITY = -32768  # below every priority: "no known priority below this one"
# A job's key in claim order; the index holds this expression.
KEY = "coalesce(concurrency_key, '')"
# The priorities the claimer knows in this queue, highest first, and their floors (sent as
# microseconds since the epoch, `jobcore.floors.micros`).


def known(floors: str, match: str) -> str:
    """The CTE `known`: of the floors `floors` lists (rows `k` with a priority `p` and a
    floor `f`, sent as microseconds since the epoch), those `match` keeps, priorities
    (`ps`) and floors (`fs`) highest first."""
    return f"""
    known AS MATERIALIZED (
        SELECT coalesce(array_agg(k.p ORDER BY k.p DESC), '{{}}') AS ps,
               coalesce(array_agg(CAST('epoch' AS timestamptz) + k.f * INTERVAL '1 microsecond'
                                  ORDER BY k.p DESC), '{{}}') AS fs
        FROM {floors}
        WHERE {match}
    )"""


_KNOWN = known(
    """unnest(CAST(:floor_queues AS text[]),
                    CAST(:floor_priorities AS smallint[]),
                    CAST(:floors AS bigint[])) AS k(q, p, f)""",
    "k.q = w.queue",
)
# The pending jobs of the queue at hand.
_IN_QUEUE = f"status = {_PENDING} AND queue = w.queue"


def _next_priority(above: str, i: str, where: str = _IN_QUEUE) -> str:
    """The next priority present below `above` (SQL, NULL: the top), where `i` is the
    place in `known` of the highest known priority below it: the highest pending one in
    the gap down to that known priority (no read where they are adjacent), else that known
    priority and its floor. A row (p, f, i) with `i` the place of the known priority below
    p; none past the last."""
    bound = f" AND priority < {above}" if above != "NULL" else ""
    gap = f" AND coalesce(known.ps[{i}], {_NO_PRIORITY}) < {above} - 1" if above != "NULL" else ""
    return f"""SELECT * FROM (
            SELECT g.priority AS p, CAST(NULL AS timestamptz) AS f, {i} AS i FROM (
                SELECT priority FROM jobqueue.jobs
                WHERE {where}{bound}
                  AND priority > coalesce(known.ps[{i}], {_NO_PRIORITY}){gap}
                ORDER BY priority DESC LIMIT 1
            ) AS g
            UNION ALL
            SELECT known.ps[{i}], known.fs[{i}], {i} + 1 WHERE known.ps[{i}] IS NOT NULL
        ) AS step LIMIT 1"""


# Each step is one probe of the index at most, and finds its known priority by its place:
# a claim costs no more per priority for knowing many.
def priorities(known: str = _KNOWN, where: str = _IN_QUEUE) -> str:
    """`WITH RECURSIVE known, priorities(p, f, i)`: the priorities present among the
    pending jobs `where` selects, highest first, each with its floor from `known` (a CTE of
    the floors' priorities `ps` and floors `fs`, highest first) or NULL."""
    return f"""
    WITH RECURSIVE {known.strip()}, priorities(p, f, i) AS (
        SELECT n.p, n.f, n.i FROM known
        CROSS JOIN LATERAL ({_next_priority("NULL", "1", where)}) AS n
        UNION ALL
        SELECT n.p, n.f, n.i FROM priorities CROSS JOIN known
        CROSS JOIN LATERAL ({_next_priority("priorities.p", "priorities.i", where)}) AS n
    )"""


PRIORITIES = priorities()
FLOOR = "coalesce(priorities.f, CAST('-infinity' AS timestamptz))"
# The pending jobs of the queue and priority at hand.
_AT = f"status = {_PENDING} AND queue = w.queue AND priority = priorities.p"


# The key-less jobs' key. It is never probed for: it counts as present (a probe from the
# head of the index would read every dead entry of the key-less jobs, which the floors
# avoid), so probes look only past it, for the keys of keyed jobs.
_NO_KEY = "CAST('' AS text) COLLATE \"C\""


def _key_after(bound: str) -> str:
    """The first key at hand after `bound` (SQL)."""
    return (
        f"(SELECT {KEY} FROM jobqueue.jobs WHERE {_AT} AND {KEY} > {bound} ORDER BY {KEY} LIMIT 1)"
    )


def keys_present() -> str:
    """A recursive CTE `keys_present(k)`: '' and every key at hand, in order, then NULL."""
    return f"""keys_present(k) AS (
        SELECT {_NO_KEY}
        UNION ALL
        SELECT {_key_after("keys_present.k")} FROM keys_present WHERE keys_present.k IS NOT NULL
    )"""


def _first_after(bound: str) -> str:
    """The first key at hand after `bound` and where its first job is (SQL, a subquery of
    `k`, `tid`): the index orders a key's jobs by run_at, id, so the entry the probe for the
    key lands on is that job's."""
    return (
        f"(SELECT {KEY} AS k, ctid AS tid FROM jobqueue.jobs WHERE {_AT} AND {KEY} > {bound}"
        f" ORDER BY {KEY}, run_at, id LIMIT 1)"
    )


def _next_key(bound: str, i: str) -> str:
    """The next key at hand after `bound` (SQL), where `i` is the place in `known_keys` of
    the first known key after it, and where that key's first job is: the first key in the
    gap up to that known key (read from the gap's head), else the known key, looked for
    from its floor (whether it has jobs there or not: `present`). The index orders a key's
    jobs by run_at, id, so the entry a probe for a key lands on is that job's. A subquery of
    rows (k, tid, i, present), with `i` the place of the first known key after `k`; none
    past the last key."""
    upto = f"known_keys.ks[{i}]"
    gap = f"SELECT {KEY} AS k, ctid AS tid FROM jobqueue.jobs WHERE {_AT} AND {KEY} > {bound}"
    order = f"ORDER BY {KEY}, run_at, id LIMIT 1"
    # Up to the known key, or, past the last, to the end: one of the two runs (the other's
    # condition on `upto` is false before it reads anything).
    return f"""(SELECT * FROM (
            SELECT g.k, g.tid, {i} AS i, true AS present FROM (
                {gap} AND {KEY} < {upto} AND {upto} IS NOT NULL {order}) AS g
            UNION ALL
            SELECT g.k, g.tid, {i}, true FROM ({gap} AND {upto} IS NULL {order}) AS g
            UNION ALL
            SELECT {upto}, t.tid, {i} + 1, t.tid IS NOT NULL
            FROM (SELECT) AS one LEFT JOIN (
                SELECT ctid AS tid FROM jobqueue.jobs
                WHERE {_AT} AND {KEY} = {upto} AND run_at >= known_keys.fs[{i}]
                ORDER BY run_at, id LIMIT 1) AS t ON true
            WHERE {upto} IS NOT NULL
        ) AS step LIMIT 1)"""


def _known_after(bound: str) -> str:
    """The place in `known_keys` of the first known key after `bound` (SQL)."""
    return (
        f"(SELECT coalesce(min(n), cardinality(known_keys.ks) + 1) FROM"
        f' unnest(known_keys.ks) WITH ORDINALITY AS u(k, n) WHERE u.k > {bound} COLLATE "C")'
    )


# The keys this claimer knows at the queue and priority at hand, in key order, and their
# floors (sent as microseconds since the epoch).
_KNOWN_KEYS = """known_keys AS MATERIALIZED (
            SELECT coalesce(array_agg(x.k ORDER BY x.k COLLATE "C"), '{}') AS ks,
                   coalesce(array_agg(CAST('epoch' AS timestamptz) + x.f * INTERVAL '1 microsecond'
                                      ORDER BY x.k COLLATE "C"), '{}') AS fs
            FROM unnest(CAST(:key_floor_queues AS text[]),
                        CAST(:key_floor_priorities AS smallint[]),
                        CAST(:key_floor_keys AS text[]) COLLATE "C",
                        CAST(:key_floors AS bigint[])) AS x(q, p, k, f)
            WHERE x.q = w.queue AND x.p = priorities.p
        )"""
# Where a key's jobs are read from: its floor, if known.
_KEY_FLOOR = (
    "coalesce(known_keys.fs[array_position(known_keys.ks, {k})], CAST('-infinity' AS timestamptz))"
)


def _by_tid(skip: str) -> str:
    """A key's one job in this claim, when that is its first (the keys outnumber the slots):
    locked where the probe for the key found it, with no second read of the index. If
    another claimer holds it or took it meanwhile, the key's next job is read through the
    index instead (`_BY_INDEX`). Not with `skip`: the job the probe found may be one it
    skips."""
    if skip:
        return ""
    return f""", by_tid AS MATERIALIZED (
            SELECT shares.k, shares.share, shares.k_left, j.id, j.run_at
            FROM shares CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE ctid = shares.tid AND {_AT} AND run_at <= now()
                FOR UPDATE SKIP LOCKED
            ) AS j
            WHERE shares.share = 1 AND shares.tid IS NOT NULL
        )"""


# The keys whose jobs `first` reads through the index: those with a share of more than one
# job, '' (no probe found its job), and those whose probed job another claimer held or took
# (their next job, then).
_BY_INDEX = (
    "WHERE shares.share > 1 OR shares.tid IS NULL"
    " OR NOT EXISTS (SELECT FROM by_tid WHERE by_tid.k = shares.k)"
)


# Below every running job's lease, in a queue with KEY_CONCURRENCY (`key_lease_floor`, sent
# as microseconds since the epoch, NULL: unknown): where its keys' running jobs are counted
# from (`jobs_key_lease_idx`, revision 0016; `jobcore.floors.ClaimFloors.learn_key_leases`).
KEY_LEASE_FLOOR = (
    "coalesce(CAST('epoch' AS timestamptz) + CAST(:key_lease_floor AS bigint)"
    " * INTERVAL '1 microsecond', CAST('-infinity' AS timestamptz))"
)


# Keys a claim looks at beyond its free slots, for keys without room it passes over.
SEEN_BEYOND = 16


def _seen(stage: str, source: str, wanted: str, first: str) -> str:
    """`seen<stage>`: the keys `source` reads from `found` (k, tid), in turn order (`nth`,
    from `first` + 1), each with its room (`k_left`): '' and the keys of a queue without
    KEY_CONCURRENCY have all the slots; under it, `key_rooms()` (revision 0016) locks the
    first `wanted` of them that have room, counts their running jobs in a snapshot taken
    after the locks and gives their room; the others have none in this claim."""
    return f"""ask{stage} AS MATERIALIZED (
            SELECT k, tid, {first} + row_number() OVER () AS nth FROM ({source}) AS f
        ), room{stage} AS MATERIALIZED (
            SELECT r.k, r.k_left FROM (
                -- The keys and their limits less this claimer's overruns, in turn order.
                SELECT array_agg(a.k ORDER BY a.nth) AS ks,
                       array_agg(w.key_limit - coalesce((
                           SELECT sum(o.n) FROM unnest(
                               CAST(:overrun_queues AS text[]),
                               CAST(:overrun_keys AS text[]),
                               CAST(:overrun_counts AS integer[])) AS o(q, k, n)
                           WHERE o.q = w.queue AND o.k = a.k), 0)::integer
                                 ORDER BY a.nth) AS rooms,
                       -- '' takes a slot of the claim's without a lock.
                       CAST({wanted} AS integer) - (SELECT count(*) FROM ask{stage}
                                                    WHERE k = '')::integer AS wanted
                FROM ask{stage} AS a WHERE a.k <> ''
            ) AS x CROSS JOIN LATERAL jobqueue.key_rooms(
                w.queue, x.ks, x.rooms, x.wanted, {KEY_LEASE_FLOOR}) AS r
            WHERE w.key_limit IS NOT NULL AND x.ks IS NOT NULL AND x.wanted > 0
        ), seen{stage} AS MATERIALIZED (
            SELECT a.k, a.tid, a.nth,
                   CASE WHEN a.k = '' OR w.key_limit IS NULL THEN w.n
                        ELSE coalesce((SELECT r.k_left FROM room{stage} AS r
                                       WHERE r.k = a.k COLLATE "C"), 0) END AS k_left
            FROM ask{stage} AS a
        )"""


# How many keys after the first w.n a claim looks at, and which.
_LOOKED_AGAIN = f"SELECT CASE WHEN m > 0 THEN m + {SEEN_BEYOND} ELSE 0 END FROM short"
_AGAIN = f"SELECT k, tid FROM found OFFSET w.n LIMIT ({_LOOKED_AGAIN})"


def _walk_from_head() -> str:
    """The CTEs `after` and `wrapped` (k, tid, present) of `_in_turn`: the keys at hand from
    the last turn's key on, then from the first round to it, each read from its head."""
    return f"""after(k, tid, present) AS (
            SELECT CASE WHEN l.c IS NULL THEN {_NO_KEY} ELSE n.k END, n.tid, true
            FROM last_turn AS l LEFT JOIN LATERAL {_first_after("l.c")} AS n ON true
            UNION ALL
            SELECT n.k, n.tid, true FROM after CROSS JOIN LATERAL {_first_after("after.k")} AS n
        ), wrapped(k, tid, present) AS (
            SELECT {_NO_KEY}, CAST(NULL AS tid), true WHERE (SELECT c FROM last_turn) IS NOT NULL
            UNION ALL
            SELECT n.k, n.tid, true FROM wrapped
            CROSS JOIN LATERAL {_first_after("wrapped.k")} AS n
            WHERE wrapped.k < (SELECT c FROM last_turn)
        )"""


def _walk_from_floors() -> str:
    """`_walk_from_head`'s CTEs with the keys the claimer knows (`known_keys`), each looked
    for from its floor, and rows for the known keys without jobs there (`present` false)."""
    return f"""{_KNOWN_KEYS}, after(k, tid, i, present) AS (
            -- From '' (present), or from the last turn's key (served: not in this turn).
            SELECT coalesce(l.c, {_NO_KEY}), CAST(NULL AS tid),
                   {_known_after(f"coalesce(l.c, {_NO_KEY})")}, l.c IS NULL
            FROM last_turn AS l CROSS JOIN known_keys
            UNION ALL
            SELECT n.k, n.tid, n.i, n.present FROM after CROSS JOIN known_keys
            CROSS JOIN LATERAL {_next_key("after.k", "after.i")} AS n
        ), wrapped(k, tid, i, present) AS (
            SELECT {_NO_KEY}, CAST(NULL AS tid), 1, true
            WHERE (SELECT c FROM last_turn) IS NOT NULL
            UNION ALL
            SELECT n.k, n.tid, n.i, n.present FROM wrapped CROSS JOIN known_keys
            CROSS JOIN LATERAL {_next_key("wrapped.k", "wrapped.i")} AS n
            WHERE wrapped.k < (SELECT c FROM last_turn)
        )"""


def _in_turn(skip: str, key_floors: bool) -> str:
    """The jobs a claim takes at one priority of one queue, keys in turn (see above); with
    `key_floors`, the known keys read from their floors."""
    walk = _walk_from_floors() if key_floors else _walk_from_head()
    key_floor = (
        f"(SELECT {_KEY_FLOOR.format(k='shares.k')} FROM known_keys)"
        if key_floors
        else "CAST('-infinity' AS timestamptz)"
    )
    return f"""
        WITH RECURSIVE last_turn AS MATERIALIZED (
            SELECT (SELECT t.k FROM unnest(CAST(:turn_queues AS text[]),
                                           CAST(:turn_priorities AS smallint[]),
                                           CAST(:turns AS text[])) AS t(q, p, k)
                    WHERE t.q = w.queue AND t.p = priorities.p LIMIT 1) COLLATE "C" AS c
        ), {walk}, found AS MATERIALIZED (
            -- The keys in turn, read as far as the claim needs them: the first w.n, then,
            -- should some have no room, as many again and SEEN_BEYOND more.
            SELECT k, tid FROM (SELECT k, tid, present FROM after WHERE k IS NOT NULL
                                UNION ALL
                                SELECT k, tid, present FROM wrapped
                                WHERE k <= (SELECT c FROM last_turn)) AS f
            -- '' takes a turn only with a due job past its floor (read from there).
            WHERE present AND (k <> '' OR EXISTS (
                SELECT FROM jobqueue.jobs
                WHERE {_AT} AND {KEY} = '' AND run_at >= {FLOOR} AND run_at <= now(){skip}))
            LIMIT 2 * w.n + {SEEN_BEYOND}
        ), {_seen("1", "SELECT k, tid FROM found LIMIT w.n", "w.n", "0")}, short AS MATERIALIZED (
            -- The keys of the first w.n without room: as many keys with room are looked for
            -- among the next m + SEEN_BEYOND.
            SELECT count(*) AS m FROM seen1 WHERE k_left <= 0
        ), {_seen("2", _AGAIN, "(SELECT m FROM short)", "w.n")}, keys AS MATERIALIZED (
            SELECT k, tid, k_left FROM (SELECT * FROM seen1 UNION ALL SELECT * FROM seen2) AS s
            WHERE k_left > 0 ORDER BY nth LIMIT w.n
        ), shares AS MATERIALIZED (
            SELECT k, tid, k_left,
                   least(ceil(w.n / (SELECT count(*) FROM keys)::float8)::integer, k_left)
                   AS share
            FROM keys
        ){_by_tid(skip)}, first AS MATERIALIZED (
            {"SELECT k, share, k_left, id, run_at FROM by_tid UNION ALL" if not skip else ""}
            SELECT shares.k, shares.share, shares.k_left, f.id, f.run_at
            FROM shares CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE {_AT} AND {KEY} = shares.k
                  AND run_at >= CASE WHEN shares.k = '' THEN {FLOOR} ELSE {key_floor} END
                  AND run_at <= now(){skip}
                ORDER BY run_at, id LIMIT shares.share FOR UPDATE SKIP LOCKED
            ) AS f
            {_BY_INDEX if not skip else ""}
        ), filled AS MATERIALIZED (
            -- Only when every key had its turn (fewer keys with room than slots, and every
            -- key seen): a key not reached yet comes before a second turn of one that was.
            SELECT k, k_left, count(*) AS taken, max(run_at) AS last_run_at,
                   (array_agg(id ORDER BY run_at DESC, id DESC))[1] AS last_id
            FROM first WHERE (SELECT count(*) FROM keys) < w.n
                         AND ((SELECT count(*) FROM seen1) < w.n
                              OR (SELECT count(*) FROM seen2) < ({_LOOKED_AGAIN}))
            GROUP BY k, share, k_left
            HAVING count(*) = share AND count(*) < k_left
        ), more AS MATERIALIZED (
            SELECT m.id, filled.k, filled.k_left, m.run_at FROM filled CROSS JOIN LATERAL (
                SELECT id, run_at FROM jobqueue.jobs
                WHERE {_AT} AND {KEY} = filled.k
                  AND (run_at, id) > (filled.last_run_at, filled.last_id)
                  AND run_at <= now(){skip}
                ORDER BY run_at, id
                LIMIT least(filled.k_left - filled.taken,
                            ceil((w.n - (SELECT count(*) FROM first))
                                 / (SELECT count(*) FROM filled)::float8)::integer)
                FOR UPDATE SKIP LOCKED
            ) AS m
            LIMIT greatest(w.n - (SELECT count(*) FROM first), 0)
        )
        SELECT id, k, k_left, run_at FROM first
        UNION ALL SELECT id, k, k_left, run_at FROM more"""


# The queues' KEY_CONCURRENCY locks in shared mode, in lock order, taken before anything
# else the claim does (a one-time filter): a claimer holding one exclusively (`JOB_LOCK_KEYS`)
# has committed before the keys' rooms are counted, and none takes it while this claim runs.
_KEYS_SHARED = """(
    SELECT count(pg_advisory_xact_lock_shared(l.k)) FROM (
        SELECT DISTINCT hashtextextended('jobqueue.keys:' || q.queue, 0) AS k
        FROM unnest(CAST(:queues AS text[]), CAST(:key_limits AS integer[])) AS q(queue, n)
        WHERE q.n IS NOT NULL
        ORDER BY k
    ) AS l)"""


def _due_jobs(skip: str, key_floors: bool = False) -> Any:
    """The jobs a claim takes; `skip` is a further condition on them ("" for none); with
    `key_floors`, the keys the claimer knows are read from their floors. Each
    priority's turn sees the room its key's KEY_CONCURRENCY leaves (`k_left`) but not what
    the higher priorities' took of the same key in this claim: of a key's jobs, only the
    first `k_left` in claim order across the priorities are kept (the others, locked
    meanwhile, stay pending)."""
    return (
        sa.text(
            f"""
SELECT c.id FROM (
    SELECT j.id, j.k_left, row_number() OVER (
               PARTITION BY w.queue, j.k ORDER BY j.p DESC, j.run_at, j.id) AS nth
    FROM unnest(CAST(:queues AS text[]), CAST(:slots AS integer[]),
                CAST(:key_limits AS integer[])) AS w(queue, n, key_limit)
    CROSS JOIN LATERAL ({PRIORITIES}
        SELECT d.id, d.k, d.k_left, d.run_at, priorities.p
        FROM priorities CROSS JOIN LATERAL ({_in_turn(skip, key_floors)}
        ) AS d
        WHERE priorities.p IS NOT NULL
        LIMIT w.n
    ) AS j
) AS c
WHERE c.nth <= c.k_left AND {_KEYS_SHARED} >= 0"""
        )
        .columns(sa.column("id", pg.UUID(as_uuid=True)))
        .cte("due")
        .prefix_with("MATERIALIZED")
    )


def _due_in_order(skip: str) -> Any:
    """The jobs a claim takes in claim order alone, keys or not (`jobs_claim_queue_idx`):
    the plain claim, for queues where no key has jobs (`jobcore.turns.KeyedQueues`). Planned
    and run in about a third of the time of the claim with keys in turn."""
    return (
        sa.text(
            f"""
SELECT j.id FROM unnest(CAST(:queues AS text[]), CAST(:slots AS integer[])) AS w(queue, n)
CROSS JOIN LATERAL ({PRIORITIES}
    SELECT d.id FROM priorities CROSS JOIN LATERAL (
        SELECT id FROM jobqueue.jobs
        WHERE {_AT} AND run_at >= {FLOOR} AND run_at <= now(){skip}
        ORDER BY run_at, id LIMIT w.n FOR UPDATE SKIP LOCKED
    ) AS d
    WHERE priorities.p IS NOT NULL
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
JOB_CLAIM_PLAIN = _claim(_due_in_order(""))
# The claim from the keys' floors, sent while a held horizon keeps dead entries before the
# keys' heads (`jobcore.floors.ClaimFloors.params`). A statement of its own: its walk over
# the keys costs each step more, and a claim that knows no key's floor walks them as
# JOB_CLAIM does (over 1,000 keys under KEY_CONCURRENCY, a drain at 0.76 of the rate).
JOB_CLAIM_KEY_FLOORS = _claim(_due_jobs("", key_floors=True))

# KEY_CONCURRENCY's serialisation: a transaction-scoped advisory lock per queue with a key
# limit (in key order, so two claimers cannot deadlock), taken before the claim statement
# of the same transaction, whose snapshot then sees every claim committed before.
JOB_LOCK_KEYS = sa.text(
    """
SELECT count(pg_advisory_xact_lock(k)) AS locked
FROM (
    SELECT DISTINCT hashtextextended('jobqueue.keys:' || q, 0) AS k
    FROM unnest(CAST(:locked_queues AS text[])) AS q
    ORDER BY k
) AS keys"""
).columns(sa.column("locked", sa.BigInteger))

# Seconds until the earliest pending job of these queues that is not due yet (NULL: none),
# so an idle worker can wake for it instead of polling fast: per queue, priority and key,
# the first entry past now() in the claim index. The priorities are found as the claim
# finds them, from the same floors.
JOB_NEXT_DUE = sa.text(
    f"""
SELECT EXTRACT(EPOCH FROM min(n.run_at) - now())::float8 AS seconds
FROM unnest(CAST(:queues AS text[])) AS w(queue)
CROSS JOIN LATERAL ({PRIORITIES}
    SELECT (WITH RECURSIVE {keys_present()}
            SELECT min((SELECT run_at FROM jobqueue.jobs
                        WHERE {_AT} AND {KEY} = keys_present.k AND run_at > now()
                        ORDER BY run_at LIMIT 1))
            FROM keys_present WHERE keys_present.k IS NOT NULL) AS run_at
    FROM priorities WHERE priorities.p IS NOT NULL
) AS n"""
).columns(sa.column("seconds", sa.Float))


# Per queue and priority present, the earliest due key-less pending job's run_at, found from
# the head of the claim index (without floors: `known` empty), and the same for each key the
# process knows (`key_floor_queues`, `key_floor_priorities`, `key_floor_keys`), locking
# nothing: what a process checks its floors against now and then, off the claims' path
# (`jobcore.floors`). Under a held MVCC horizon it reads every dead entry of those, as a
# claim from the head would.
JOB_CLAIM_HEADS = sa.text(
    f"""
SELECT w.queue, h.p AS priority, CAST(NULL AS text) AS concurrency_key, h.run_at
FROM unnest(CAST(:queues AS text[])) AS w(queue)
CROSS JOIN LATERAL ({PRIORITIES}
    SELECT priorities.p, (SELECT run_at FROM jobqueue.jobs
                          WHERE {_AT} AND {KEY} = '' AND run_at <= now()
                          ORDER BY run_at, id LIMIT 1) AS run_at
    FROM priorities WHERE priorities.p IS NOT NULL
) AS h
WHERE h.run_at IS NOT NULL
UNION ALL
SELECT x.q, x.p, x.k, (SELECT run_at FROM jobqueue.jobs
                       WHERE status = {_PENDING} AND queue = x.q AND priority = x.p
                         AND {KEY} = x.k AND run_at <= now()
                       ORDER BY run_at, id LIMIT 1) AS run_at
FROM unnest(CAST(:key_floor_queues AS text[]), CAST(:key_floor_priorities AS smallint[]),
            CAST(:key_floor_keys AS text[]) COLLATE "C") AS x(q, p, k)
WHERE x.q = ANY(CAST(:queues AS text[]))"""
).columns(
    sa.column("queue", sa.Text),
    sa.column("priority", sa.SmallInteger),
    sa.column("concurrency_key", sa.Text),
    sa.column("run_at", sa.DateTime(timezone=True)),
)


# The claim index's entries the scans of this transaction read so far, dead ones included:
# read around a check of the heads, the number its reads visited per head they found says
# whether a held horizon keeps dead entries there (`jobcore.floors.ClaimFloors.checked`).
TABLE_COUNT_CLAIM_READS = sa.text(
    "SELECT pg_stat_get_xact_tuples_returned(CAST('jobqueue.jobs_claim_key_idx' AS regclass)) AS n"
).columns(sa.column("n", sa.BigInteger))


# The earliest lease among the running jobs with a key of these queues, or now() if earlier
# (or none is running), read in lease order off the claims' path from the key lease floor
# it replaces (`key_lease_floor`; NULL: from the head), below which no lease lies: what a
# process's key lease floor is learnt from (`jobcore.floors.ClaimFloors.learn_key_leases`).
JOB_KEY_LEASE_FIRST = sa.text(
    f"""
SELECT least((SELECT locked_until FROM jobqueue.jobs
              WHERE status = '{Status.PROCESSING.value}'
                AND concurrency_key IS NOT NULL AND queue = ANY(CAST(:queues AS text[]))
                AND locked_until >= {KEY_LEASE_FLOOR}
              ORDER BY locked_until LIMIT 1), now()) AS first"""
).columns(sa.column("first", sa.DateTime(timezone=True)))


# COMPLETE and JOB_CLAIM in one statement, so a worker refills the slots its completed jobs
# free with the same round trip and commit (WAL flush) that records them. Each transition
# is still its own guarded UPDATE. COMPLETE runs first (the first branch is read first);
# JOB_CLAIM never waits (SKIP LOCKED), so while the statement waits for a lock it holds no
# lock of its claim. Both see one snapshot: JOB_CLAIM cannot see what COMPLETE changed, and
# needs not (a job it completes is not pending; under KEY_CONCURRENCY it still counts as
# running, so a key's share is at most one completion short). Rows, by name: `completed`
# true with the id and lease_token of a completed job (the other columns NULL), or false
# with the columns of a claimed job, as JOB_CLAIM returns them.
_done = JOB_SET_OUTCOME[Operation.COMPLETE].cte("done")
CLAIMED_COLUMNS = [name for name in Claimed.__dataclass_fields__ if name != "id"]


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
                for name in CLAIMED_COLUMNS
            ),
        ),
        sa.select(sa.false(), claimed.c.id, *(claimed.c[name] for name in CLAIMED_COLUMNS)),
    )


JOB_COMPLETE_AND_CLAIM = _complete_and_claim(JOB_CLAIM)
JOB_COMPLETE_AND_CLAIM_KEY_FLOORS = _complete_and_claim(JOB_CLAIM_KEY_FLOORS)
JOB_COMPLETE_AND_CLAIM_PLAIN = _complete_and_claim(JOB_CLAIM_PLAIN)

# With per-type limits configured, the claims above skip the limited types (`:limited`);
# those are claimed by `job_claim_limited.JOB_CLAIM_LIMITED` only.
_UNLIMITED = " AND type <> ALL(CAST(:limited AS text[]))"
JOB_CLAIM_UNLIMITED = _claim(_due_jobs(_UNLIMITED))
JOB_COMPLETE_AND_CLAIM_UNLIMITED = _complete_and_claim(JOB_CLAIM_UNLIMITED)
JOB_CLAIM_UNLIMITED_KEY_FLOORS = _claim(_due_jobs(_UNLIMITED, key_floors=True))
JOB_COMPLETE_AND_CLAIM_UNLIMITED_KEY_FLOORS = _complete_and_claim(JOB_CLAIM_UNLIMITED_KEY_FLOORS)
JOB_CLAIM_PLAIN_UNLIMITED = _claim(_due_in_order(_UNLIMITED))
JOB_COMPLETE_AND_CLAIM_PLAIN_UNLIMITED = _complete_and_claim(JOB_CLAIM_PLAIN_UNLIMITED)
