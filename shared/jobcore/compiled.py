"""The worker's calls: `jobcore.queries`' statements, compiled once, run on asyncpg; and the
one compile cache (`of`) every caller that sends a construct's SQL itself uses.

SQLAlchemy spends more CPU on a statement (compiled-cache lookup, execution
context, result processing, the greenlet hop) than PostgreSQL spends on a
batched claim. So every statement of `jobcore.queries.named()` is compiled to
asyncpg's SQL at import (`STATEMENTS`, by SQL name), and the calls below run it on
an asyncpg connection, reading its rows by column name,
which prepares each statement once and reuses it. There is one call per
operation and no other implementation: the worker and the transition tests run
the same code.

The connection must come from an engine made by `jobcore.db.make_engine`
(SQLAlchemy sets its jsonb codec, which decodes payloads): take it with
`(await conn.get_raw_connection()).driver_connection`. Outside a transaction,
each statement commits on its own; the calls that need several statements in one
transaction open one, or run in the caller's (`_transaction`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple, cast
from uuid import UUID, uuid4

from jobcore import history, maintenance, queries, search
from jobcore.catalog import recorder_name
from jobcore.floors import EPOCH, NO_KEYS, CountFloors
from jobcore.queries.job_types import record_from_row, record_params
from jobcore.rows import (
    Claimed,
    JobTypeRecord,
    Lease,
    LimitedClaim,
    Moved,
    Renewed,
    TableStats,
    TypeLimits,
    claimed_from_row,
)
from jobcore.runner import Compiled, Driver, of
from jobcore.search import QueueDepth
from jobcore.states import ATTEMPT_OUTCOMES, Operation, Status

STATEMENTS: dict[str, Compiled] = {name: of(s) for name, s in queries.named().items()}
_CLAIM = STATEMENTS["job_claim"]
_COMPLETE_AND_CLAIM = STATEMENTS["job_complete_and_claim"]
# With TYPE_CONCURRENCY or TYPE_RATE set: the same claims, skipping the limited types.
_CLAIM_UNLIMITED = STATEMENTS["job_claim_unlimited"]
_COMPLETE_AND_CLAIM_UNLIMITED = STATEMENTS["job_complete_and_claim_unlimited"]
# Where no key has jobs: the same claims in claim order alone, keys not taking turns.
_PLAIN = {
    _CLAIM: STATEMENTS["job_claim_plain"],
    _CLAIM_UNLIMITED: STATEMENTS["job_claim_plain_unlimited"],
    _COMPLETE_AND_CLAIM: STATEMENTS["job_complete_and_claim_plain"],
    _COMPLETE_AND_CLAIM_UNLIMITED: STATEMENTS["job_complete_and_claim_plain_unlimited"],
}
# With keys' floors sent: the same claims, the known keys read from their floors.
_KEY_FLOORED = {
    _CLAIM: STATEMENTS["job_claim_key_floors"],
    _CLAIM_UNLIMITED: STATEMENTS["job_claim_unlimited_key_floors"],
    _COMPLETE_AND_CLAIM: STATEMENTS["job_complete_and_claim_key_floors"],
    _COMPLETE_AND_CLAIM_UNLIMITED: STATEMENTS["job_complete_and_claim_unlimited_key_floors"],
}
_LOCK_TYPES = STATEMENTS["job_lock_types"]
_LOCK_KEYS = STATEMENTS["job_lock_keys"]
_CLAIM_LIMITED = STATEMENTS["job_claim_limited"]
_OUTCOMES = {op: STATEMENTS[f"job_set_outcome_{op}"] for op in ATTEMPT_OUTCOMES}


# lock_not_available (a lock_timeout ran out); a leaf another worker adds at the same
# moment: duplicate_table, or unique_violation (the two CREATE TABLEs raced in the
# catalog), or its range overlapping once attached (invalid_object_definition).
_BUSY = frozenset({"55P03", "42P07", "23505", "42P17"})
# check_violation: a row that no partition takes.
_NO_PARTITION = "23514"


def _transaction(conn: Driver) -> contextlib.AbstractAsyncContextManager[Any]:
    """A transaction of its own, or none inside the caller's (the worker runs every call in
    one that carries its settings)."""
    return contextlib.nullcontext() if conn.is_in_transaction() else conn.transaction()


@contextlib.asynccontextmanager
async def _atomic(conn: Driver) -> AsyncIterator[None]:
    """A transaction of its own, or a savepoint in the caller's: a failure undoes what ran
    inside, and only that."""
    if not conn.is_in_transaction():
        async with conn.transaction():
            yield
        return
    await conn.fetch("SAVEPOINT jobqueue_atomic")
    try:
        yield
    except BaseException:
        await conn.fetch("ROLLBACK TO SAVEPOINT jobqueue_atomic")
        raise
    await conn.fetch("RELEASE SAVEPOINT jobqueue_atomic")


def _slots(slots: Mapping[str, int]) -> dict[str, list[Any]]:
    wanted = {queue: n for queue, n in slots.items() if n > 0}
    if not wanted:
        raise ValueError(f"a claim needs a queue with a free slot, got {dict(slots)}")
    return {"queues": list(wanted), "slots": list(wanted.values())}


def _keyed(
    values: dict[str, Any],
    key_limits: Mapping[str, int],
    key_overruns: Mapping[tuple[str, str], int] | None,
) -> list[str]:
    """Add the claim's per-queue KEY_CONCURRENCY and the claimer's overrunning handlers per
    (queue, key) to `values`; the queues with a key limit (whose `JOB_LOCK_KEYS` lock the
    limited claim takes, and the others take shared within their statement)."""
    limits = [key_limits.get(queue) for queue in values["queues"]]
    values["key_limits"] = limits
    overruns = sorted((key_overruns or {}).items())
    values["overrun_queues"] = [queue for (queue, _), _ in overruns]
    values["overrun_keys"] = [key for (_, key), _ in overruns]
    values["overrun_counts"] = [n for _, n in overruns]
    return [queue for queue, limit in zip(values["queues"], limits, strict=True) if limit]


async def _lock_keys(conn: Driver, values: dict[str, Any], locked: list[str]) -> None:
    """Take the KEY_CONCURRENCY locks of the `locked` queues (in the caller's transaction)."""
    if locked:
        values["locked_queues"] = locked
        await conn.fetch(_LOCK_KEYS.sql, *_LOCK_KEYS.args(values))


# A claim without floors reads the claim index from its head (`jobcore.floors`); one without
# turns starts each priority's keys from the first (`jobcore.turns`).
NO_FLOORS: Mapping[str, Any] = {
    "floor_queues": [],
    "floor_priorities": [],
    "floors": [],
    **NO_KEYS,
    "key_lease_floor": None,
}
NO_TURNS: Mapping[str, list[Any]] = {"turn_queues": [], "turn_priorities": [], "turns": []}
# No handler of a keyed job outlived its attempt (`claim`'s `key_overruns`).
NO_OVERRUNS: Mapping[str, list[Any]] = {
    "overrun_queues": [],
    "overrun_keys": [],
    "overrun_counts": [],
}


async def claim(
    conn: Driver,
    slots: Mapping[str, int],
    lease_seconds: float,
    claim_id: UUID | None = None,
    limited: Sequence[str] = (),
    floors: Mapping[str, Any] = NO_FLOORS,
    turns: Mapping[str, list[Any]] = NO_TURNS,
    key_limits: Mapping[str, int] | None = None,
    key_overruns: Mapping[tuple[str, str], int] | None = None,
    plain: bool = False,
) -> list[Claimed]:
    """Lease up to `slots[queue]` due jobs of each queue, in claim order, skipping rows
    other claimers hold and jobs of the `limited` types; `claim_id` names this claim for
    `release_claim`, should its answer be lost. `floors` (`ClaimFloors.params`) says where
    each (queue, priority) is read from, none: from the head; `turns` (`KeyTurns.params`)
    which key each starts after; `key_limits`, per queue, KEY_CONCURRENCY; `key_overruns`,
    per (queue, key), this process's handlers still running after their attempts were
    recorded (each still holds a unit of its key's KEY_CONCURRENCY). `plain`: in claim order
    alone, keys not taking turns (no key limits then), for queues where no key has jobs."""
    values = {
        **_slots(slots),
        **floors,
        **turns,
        "lease_seconds": lease_seconds,
        "claim": claim_id or uuid4(),
        "holder": recorder_name(),
    }
    locked = _keyed(values, key_limits or {}, key_overruns)
    statement = _CLAIM
    if limited:
        statement = _CLAIM_UNLIMITED
        values["limited"] = list(limited)
    if plain:
        statement = _plain(statement, locked)
    elif values.get("key_floor_keys"):
        statement = _KEY_FLOORED[statement]
    rows = await conn.fetch(statement.sql, *statement.args(values))
    return [claimed_from_row(row) for row in rows]


def _plain(statement: Compiled, locked: list[str]) -> Compiled:
    if locked:
        raise ValueError(f"a plain claim cannot apply KEY_CONCURRENCY (queues {locked})")
    return _PLAIN[statement]


async def claim_limited(
    conn: Driver,
    limits: TypeLimits,
    slots: Mapping[str, int],
    lease_seconds: float,
    claim_id: UUID | None = None,
    floors: Mapping[str, Any] = NO_FLOORS,
    overruns: Mapping[str, int] | None = None,
    key_limits: Mapping[str, int] | None = None,
    key_overruns: Mapping[tuple[str, str], int] | None = None,
    type_floors: Mapping[str, list[Any]] | None = None,
) -> LimitedClaim:
    """Lease due jobs of the limited types, in claim order against every other type's due
    jobs, at most `slots[queue]` of each queue (those the other types outrank are left to
    `claim`), and never beyond their limits across every worker of the database: one
    transaction, serialised with other claimers of the same types by advisory locks.
    `floors` as for `claim` (the other types are read from them); `overruns`: per limited
    type, this process's handlers still running after their attempts were recorded (each
    still holds a unit of its TYPE_CONCURRENCY); `key_limits` and `key_overruns` as for
    `claim`: KEY_CONCURRENCY holds for the limited types' jobs too. `type_floors`: where
    the limited types' jobs and leases are read from (`jobcore.floors.TypeFloors.params`;
    None: from the head)."""
    types = limits.types
    rates = [limits.rate.get(name) for name in types]
    overruns = overruns or {}
    values = {
        **_slots(slots),
        **floors,
        "types": types,
        "concurrency": [limits.concurrency.get(name) for name in types],
        "overruns": [overruns.get(name, 0) for name in types],
        "rates": [rate[0] if rate else None for rate in rates],
        "periods": [rate[1] if rate else None for rate in rates],
        "lease_seconds": lease_seconds,
        "claim": claim_id or uuid4(),
        "holder": recorder_name(),
        **(type_floors or _no_type_floors(types)),
    }
    locked = _keyed(values, key_limits or {}, key_overruns)
    async with _transaction(conn):
        # The types' locks first, then the queues' (as every other claimer takes them): no
        # two claimers wait for each other in a cycle.
        await conn.fetch(_LOCK_TYPES.sql, *_LOCK_TYPES.args(values))
        await _lock_keys(conn, values, locked)
        rows = await conn.fetch(_CLAIM_LIMITED.sql, *_CLAIM_LIMITED.args(values))
    jobs: list[Claimed] = []
    held: dict[str, str] = {}
    waits: list[float] = []
    running: dict[str, int] = {}
    for row in rows:
        if row["id"] is not None:
            jobs.append(claimed_from_row(row))
            continue
        running[row["type"]] = row["running"]
        if row["held"] is not None:
            held[row["type"]] = row["held"]
            if row["held"] == "rate" and row["wait"] is not None:
                waits.append(max(float(row["wait"]), 0.0))
    return LimitedClaim(jobs, held, min(waits) if waits else None, running)


def _no_type_floors(types: Sequence[str]) -> dict[str, list[Any]]:
    """The limited claim's floor parameters for a read from the head."""
    return {
        "type_floor_types": [],
        "type_floor_queues": [],
        "type_floor_priorities": [],
        "type_floors": [],
        "lease_floors": [None] * len(types),
    }


async def next_due(
    conn: Driver, queues: Sequence[str], floors: Mapping[str, Any] = NO_FLOORS
) -> float | None:
    """Seconds until the earliest pending job of `queues` that is not due yet; None if none."""
    statement = STATEMENTS["job_next_due"]
    rows = await conn.fetch(statement.sql, *statement.args({"queues": list(queues), **floors}))
    seconds = rows[0]["seconds"] if rows else None
    return None if seconds is None else float(seconds)


class Head(NamedTuple):
    """The earliest due pending job of a queue at one priority, key-less or of one key:
    when it is due."""

    queue: str
    priority: int
    run_at: datetime
    concurrency_key: str | None = None


async def key_lease_first(
    conn: Driver, queues: Sequence[str], floor: int | None = None
) -> datetime:
    """The earliest lease among the running jobs with a key of `queues`, or now() if earlier
    (none running), read in lease order from `floor` (the key lease floor it replaces, as
    `micros`; None: from the head); locks nothing."""
    statement = STATEMENTS["job_key_lease_first"]
    values = {"queues": list(queues), "key_lease_floor": floor}
    rows = await conn.fetch(statement.sql, *statement.args(values))
    return cast(datetime, rows[0]["first"])


class HeadsRead(NamedTuple):
    """A check of the heads: what it found, and the claim index entries it read to."""

    heads: list[Head]
    entries: int


async def check_heads(
    conn: Driver, queues: Sequence[str], keys: Mapping[str, list[Any]] = NO_KEYS
) -> HeadsRead:
    """`claim_heads`, and how many claim index entries it read, dead ones included (in
    one transaction: the count is the transaction's)."""
    counted = STATEMENTS["table_count_claim_reads"]
    async with _transaction(conn):
        before = (await conn.fetch(counted.sql))[0]["n"]
        heads = await claim_heads(conn, queues, keys)
        after = (await conn.fetch(counted.sql))[0]["n"]
    return HeadsRead(heads, int(after - before))


async def claim_heads(
    conn: Driver, queues: Sequence[str], keys: Mapping[str, list[Any]] = NO_KEYS
) -> list[Head]:
    """Per queue and priority present, the earliest due key-less pending job's run_at, and
    per key of `keys` (`ClaimFloors.keys`) the earliest due one of its, read from the head
    of the claim index; locks nothing."""
    statement = STATEMENTS["job_claim_heads"]
    values = {"queues": list(queues), **NO_FLOORS, **keys}
    rows = await conn.fetch(statement.sql, *statement.args(values))
    return [
        Head(row["queue"], row["priority"], row["run_at"], row["concurrency_key"])
        for row in rows
        if row["run_at"] is not None
    ]


async def record(
    conn: Driver,
    operation: Operation,
    leases: Sequence[Lease],
    errors: Sequence[str] = (),
    delays: Sequence[float] = (),
    results: Sequence[str | None] = (),
    tracebacks: Sequence[str | None] = (),
) -> list[Lease]:
    """Record how the attempts held under `leases` ended, with one fenced statement:
    `operation` is one of `ATTEMPT_OUTCOMES`; `errors` and `tracebacks` (the operations that
    write an error: the formatted exception, None for none; empty: none for any), `delays`
    (retry_later, snooze: seconds until due again) and `results` (complete: JSON text, None
    for no result; empty: none for any) go with the leases, in order.
    Returns the leases that were lost (not applied)."""
    if not leases:
        return []
    statement = _OUTCOMES[operation]
    values: dict[str, Any] = {
        "ids": [lease.job_id for lease in leases],
        "tokens": [lease.lease_token for lease in leases],
    }
    if operation.writes_error:
        values["errors"] = list(errors)
        values["tracebacks"] = list(tracebacks) if tracebacks else [None] * len(leases)
    if operation.due_again and not operation.delay_grows:
        values["delays"] = list(delays)
    if operation.writes_result:
        values["results"] = list(results) if results else [None] * len(leases)
    rows = await conn.fetch(statement.sql, *statement.args(values))
    if len(rows) == len(leases):
        return []
    # By (id, token): a batch may hold an old and a new lease of the same job.
    applied = {Lease(row["id"], row["lease_token"]) for row in rows}
    return [lease for lease in leases if lease not in applied]


async def complete_and_claim(
    conn: Driver,
    leases: Sequence[Lease],
    slots: Mapping[str, int],
    lease_seconds: float,
    claim_id: UUID | None = None,
    limited: Sequence[str] = (),
    results: Sequence[str | None] = (),
    floors: Mapping[str, Any] = NO_FLOORS,
    turns: Mapping[str, list[Any]] = NO_TURNS,
    key_limits: Mapping[str, int] | None = None,
    key_overruns: Mapping[tuple[str, str], int] | None = None,
    plain: bool = False,
) -> tuple[list[Lease], list[Claimed]]:
    """`record(COMPLETE, leases, results=results)` and `claim(slots, lease_seconds,
    claim_id, limited, floors, turns, key_limits, key_overruns, plain)` in one statement.
    Returns (the lost leases, the claimed jobs)."""
    values = {
        **floors,
        **turns,
        "ids": [lease.job_id for lease in leases],
        "tokens": [lease.lease_token for lease in leases],
        "results": list(results) if results else [None] * len(leases),
        **_slots(slots),
        "lease_seconds": lease_seconds,
        "claim": claim_id or uuid4(),
        "holder": recorder_name(),
    }
    locked = _keyed(values, key_limits or {}, key_overruns)
    statement = _COMPLETE_AND_CLAIM
    if limited:
        statement = _COMPLETE_AND_CLAIM_UNLIMITED
        values["limited"] = list(limited)
    if plain:
        statement = _plain(statement, locked)
    elif values.get("key_floor_keys"):
        statement = _KEY_FLOORED[statement]
    rows = await conn.fetch(statement.sql, *statement.args(values))
    applied = set()
    claimed = []
    for row in rows:
        if row["completed"]:
            applied.add(Lease(row["id"], row["lease_token"]))
        else:
            claimed.append(claimed_from_row(row))
    if len(applied) == len(leases):
        return [], claimed
    return [lease for lease in leases if lease not in applied], claimed


async def renew(conn: Driver, leases: Sequence[Lease], lease_seconds: float) -> Renewed:
    """Extend the leases of running attempts to `lease_seconds` from now; a job row another
    transaction holds locked is left as it is (`busy`), not waited for."""
    if not leases:
        return Renewed([], [], [])
    statement = STATEMENTS["job_renew_many"]
    values = {
        "ids": [lease.job_id for lease in leases],
        "tokens": [lease.lease_token for lease in leases],
        "lease_seconds": lease_seconds,
    }
    rows = await conn.fetch(statement.sql, *statement.args(values))
    held = {Lease(row["id"], row["lease_token"]): row for row in rows}
    return Renewed(
        lost=[lease for lease in leases if lease not in held],
        cancel=[lease for lease, row in held.items() if row["cancel"]],
        busy=[lease for lease, row in held.items() if not row["renewed"]],
    )


async def release_claim(conn: Driver, claim_ids: Sequence[UUID]) -> list[UUID]:
    """processing -> pending, attempt given back, for every job these claims took.
    Returns the ids of the jobs handed back."""
    statement = STATEMENTS["job_release_claim"]
    rows = await conn.fetch(statement.sql, *statement.args({"claim_ids": list(claim_ids)}))
    return [row["id"] for row in rows]


async def recover_expired(conn: Driver, window: float | None = None) -> list[tuple[UUID, Status]]:
    """Jobs whose lease ran out go back to pending, or to dead_letter after their last
    attempt; with `window`, only leases that ran out at most that many seconds ago. At most
    `queries.RECOVER_BATCH` a call: fewer means none are left."""
    statement = STATEMENTS["job_recover_expired"]
    rows = await conn.fetch(statement.sql, *statement.args({"window": window}))
    return [(row["id"], Status(row["status"])) for row in rows]


async def queue_depths(
    conn: Driver, floors: CountFloors | None = None, sweep: bool = True
) -> list[QueueDepth]:
    """Every queue that holds jobs, with its depths (`jobcore.search.QUEUE_GET_DEPTHS`):
    read from the head, or with `floors` from them unless this is a `sweep`; either way
    `floors` learns where the read found the first live jobs."""
    statement = STATEMENTS["queue_get_depths"]
    values = search.FROM_THE_HEAD if floors is None else floors.params(sweep=sweep)
    rows = await conn.fetch(statement.sql, *statement.args(values))
    if floors is not None:
        floors.learn([search.counted_from_row(row) for row in rows], sweep=sweep)
    return [search.depth_from_row(row) for row in rows]


# A schema at 0008 or 0009 (`schema.ACCEPTED_REVISIONS`) has no `queue_pauses`: nothing
# can be paused there.
_UNDEFINED_TABLE = "42P01"


async def notification_send(conn: Driver, token: str) -> None:
    """Notify the notification check's channel with `token` (`jobcore.notifications`)."""
    statement = STATEMENTS["notification_send"]
    await conn.fetch(statement.sql, *statement.args({"token": token}))


async def paused_queues(conn: Driver) -> frozenset[str]:
    """The paused queues (`jobcore.pauses`)."""
    statement = STATEMENTS["queue_list_paused"]
    try:
        rows = await conn.fetch(statement.sql)
    except Exception as exc:
        if getattr(exc, "sqlstate", None) != _UNDEFINED_TABLE:
            raise
        return frozenset()
    return frozenset(row["queue"] for row in rows)


async def take_lead(conn: Driver, task: str, holder: UUID, lease_seconds: float) -> bool:
    """Lead `task` for `lease_seconds` from now if nobody else does (or keep leading it);
    whether `holder` leads it now."""
    statement = STATEMENTS["lead_take"]
    values = {"task": task, "holder": holder, "lease_seconds": lease_seconds}
    return bool(await conn.fetch(statement.sql, *statement.args(values)))


async def resign(conn: Driver, task: str, holder: UUID) -> None:
    """Stop leading `task`, so another worker may take it at once."""
    statement = STATEMENTS["lead_resign"]
    await conn.fetch(statement.sql, *statement.args({"task": task, "holder": holder}))


async def prune(conn: Driver, status: Status, age_seconds: float) -> int:
    """Delete at most `maintenance.PRUNE_BATCH` jobs of the finished `status` that finished
    more than `age_seconds` ago, in `jobs` (and, completed, as many again in
    `jobs_history`); how many it deleted (fewer than the batch: none are left)."""
    statement = STATEMENTS[f"job_prune_{status}"]
    rows = await conn.fetch(statement.sql, *statement.args({"age": age_seconds}))
    pruned = int(rows[0]["pruned"])
    if status is Status.COMPLETED:
        statement = STATEMENTS["history_prune"]
        values = {"age": age_seconds, "batch": maintenance.PRUNE_BATCH}
        rows = await conn.fetch(statement.sql, *statement.args(values))
        pruned += int(rows[0]["pruned"])
    return pruned


async def history_leaves(conn: Driver) -> list[history.Leaf]:
    """The leaves of `jobs_history` (`jobcore.history`), oldest first."""
    statement = STATEMENTS["history_list_leaves"]
    rows = await conn.fetch(statement.sql, *statement.args({"parent": history.parent()}))
    return sorted(leaf for row in rows if (leaf := history.parse(row["name"])) is not None)


async def history_add_leaf(conn: Driver, leaf: history.Leaf) -> bool:
    """Add `leaf` to `jobs_history`; False if it could not now (another worker adds it, or
    the parent's lock is held: the caller tries again later)."""
    return await _unless_busy(conn, history.create_sql(leaf)) is not None


async def history_move(
    conn: Driver,
    retention_seconds: float,
    batch: int,
    after: float = history.MOVE_AFTER,
    since: datetime | None = None,
) -> Moved:
    """Move at most `batch` completed jobs without a key, finished more than `after`
    seconds ago (and at `since` or later, if given), from `jobs` to `jobs_history`, the
    oldest first, adding the leaves they need first (`jobcore.history`); fewer than the
    batch: none are left. None moved also when a leaf could not be added now or one was
    dropped meanwhile: the next call tries again."""
    statement = STATEMENTS["history_get_oldest"]
    found = (await conn.fetch(statement.sql, *statement.args({"since": since or EPOCH})))[0]
    none = Moved(0, None)
    if found["oldest"] is None:
        return none
    now = found["now"]
    if found["oldest"] >= now - timedelta(seconds=after):
        return none  # nothing has been finished long enough: one statement, no leaf yet
    start = history.move_start(found["oldest"], now, retention_seconds)
    leaves = await history_leaves(conn)
    width = history.leaf_width(retention_seconds)
    for leaf in history.leaves_to_add(leaves, start, now, width):
        if not await history_add_leaf(conn, leaf):
            return none
        leaves.append(leaf)
    covering = [leaf for leaf in sorted(leaves) if leaf.upper > start]
    statement = STATEMENTS["history_move"]
    until = min(covering[-1].upper, now - timedelta(seconds=after))
    lower = covering[0].lower if since is None else max(covering[0].lower, since)
    values = {"since": lower, "until": until, "batch": batch}
    try:
        async with _atomic(conn):
            rows = await conn.fetch(statement.sql, *statement.args(values))
    except Exception as exc:
        # A job whose leaf retention dropped meanwhile: it has expired, and retention
        # deletes it from `jobs`.
        if getattr(exc, "sqlstate", None) == _NO_PARTITION:
            return none
        raise
    return Moved(int(rows[0]["moved"]), rows[0]["newest"])


async def history_drop_expired(conn: Driver, age_seconds: float) -> int | None:
    """Drop the oldest leaf of `jobs_history` whose every job finished more than
    `age_seconds` ago; how many jobs it held, or None if there is none (or its lock is
    held by a reader now: the next round tries again)."""
    cutoff = (await conn.fetch("SELECT now() AS now"))[0]["now"]
    cutoff -= timedelta(seconds=age_seconds)
    leaves = history.expired(await history_leaves(conn), cutoff)
    if not leaves:
        return None
    leaf = leaves[0]
    answers = await _unless_busy(conn, [history.count_sql(leaf), *history.drop_sql(leaf)])
    return None if answers is None else int(answers[0][0]["n"])


async def _unless_busy(conn: Driver, statements: list[str]) -> list[list[Any]] | None:
    """Each statement's rows, all run in one transaction (or savepoint); None, with nothing
    done, if a lock or a leaf was busy (`_BUSY`)."""
    try:
        async with _atomic(conn):
            return [await conn.fetch(sql) for sql in statements]
    except Exception as exc:
        if getattr(exc, "sqlstate", None) in _BUSY:
            return None
        raise


async def table_stats(conn: Driver) -> list[TableStats]:
    """jobqueue's tables as `maintenance.TABLE_GET_STATS` reads them."""
    statement = STATEMENTS["table_get_stats"]
    rows = await conn.fetch(statement.sql, *statement.args({"tables": maintenance.tables()}))
    return [TableStats(row["name"], int(row["dead"]), bool(row["autovacuum"])) for row in rows]


async def record_types(conn: Driver, records: Sequence[tuple[str, str, str]], by: str) -> None:
    """Record (or refresh) the types a worker process serves (`queries.JOB_TYPE_RECORD`):
    (type, options JSON, schedules JSON), recorded `by` that process."""
    if not records:
        return
    statement = STATEMENTS["job_type_record"]
    await conn.fetch(statement.sql, *statement.args(record_params(records, by)))


async def recorded_types(conn: Driver, max_age: float) -> list[JobTypeRecord]:
    """Every type some worker recorded within `max_age` seconds (`queries.JOB_TYPE_LIST`)."""
    statement = STATEMENTS["job_type_list"]
    rows = await conn.fetch(statement.sql, *statement.args({"max_age": max_age}))
    return [record_from_row(row) for row in rows]
