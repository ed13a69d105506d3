"""The worker's store calls keep their plans safe: each statement is planned once per
connection (generic plans) under settings that leave an index walk in order as the only
way to run it, so a plan made while the table was tiny, with no statistics, still reads
about the rows a call touches once a burst has arrived."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import sqlalchemy as sa

from jobcore import compiled
from jobcore.rows import Lease, TypeLimits
from jobcore.states import Operation
from jobqueue_worker.database import SETTINGS, _begin
from tests.pg import driver

LEASE = 60.0
SLOTS = 50
BURST = 20_000
RUNNING = 1_000
# Rows read (index entries and heap tuples, sequential scans included) by one call, at
# most: a few reads of every running job (the planner may rightly find a scan of the lease
# index cheaper than a probe per id), never the burst of pending jobs.
MOST_READ = 8 * RUNNING
KEYS = {"default": 2}

# Every row any scan of the jobs table or one of its indexes has read in this transaction.
_READ = """
SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(oid)
                    + pg_stat_get_xact_tuples_fetched(oid)), 0)::bigint
FROM pg_class
WHERE oid = 'jobqueue.jobs'::regclass
   OR oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'jobqueue.jobs'::regclass)"""


async def _leases(conn: Any) -> list[Lease]:
    rows = await conn.fetch(
        "SELECT id, lease_token FROM jobqueue.jobs WHERE status = 'processing' ORDER BY id LIMIT 20"
    )
    return [Lease(row["id"], row["lease_token"]) for row in rows]


Call = Callable[[Any, list[Lease]], Awaitable[object]]


async def _record(conn: Any, leases: list[Lease], operation: Operation) -> object:
    n = len(leases)
    return await compiled.record(
        conn, operation, leases, errors=["boom"] * n, delays=[30.0] * n, results=[None] * n
    )


async def _renew(conn: Any, leases: list[Lease]) -> object:
    return await compiled.renew(conn, leases, LEASE)


async def _limited(conn: Any, leases: list[Lease]) -> object:
    return await compiled.claim_limited(
        conn, TypeLimits(concurrency={"report": 5}), {"default": SLOTS}, LEASE, key_limits=KEYS
    )


async def _complete_and_claim(conn: Any, leases: list[Lease], plain: bool) -> object:
    return await compiled.complete_and_claim(
        conn,
        leases,
        {"default": SLOTS},
        LEASE,
        key_limits=None if plain else KEYS,
        plain=plain,
    )


CALLS: dict[str, Call] = {
    "claim": lambda conn, _: compiled.claim(conn, {"default": SLOTS}, LEASE, key_limits=KEYS),
    "claim_plain": lambda conn, _: compiled.claim(conn, {"default": SLOTS}, LEASE, plain=True),
    "claim_unlimited": lambda conn, _: compiled.claim(
        conn, {"default": SLOTS}, LEASE, limited=["report"], key_limits=KEYS
    ),
    "claim_plain_unlimited": lambda conn, _: compiled.claim(
        conn, {"default": SLOTS}, LEASE, limited=["report"], plain=True
    ),
    "claim_limited": _limited,
    "complete_and_claim": lambda conn, leases: _complete_and_claim(conn, leases, plain=False),
    "complete_and_claim_plain": lambda conn, leases: _complete_and_claim(conn, leases, plain=True),
    **{
        op.value: (lambda conn, leases, op=op: _record(conn, leases, op))
        for op in compiled.ATTEMPT_OUTCOMES
    },
    "renew": _renew,
    "recover_expired": lambda conn, _: compiled.recover_expired(conn),
    "recover_window": lambda conn, _: compiled.recover_expired(conn, window=30.0),
    "next_due": lambda conn, _: compiled.next_due(conn, ["default"]),
    "claim_heads": lambda conn, _: compiled.claim_heads(conn, ["default"]),
}


async def _rows_read(conn: Any, call: Call) -> int:
    """The rows `call` reads, in a transaction of the store's settings, rolled back."""
    await conn.execute(_begin(SETTINGS))
    try:
        leases = await _leases(conn)
        before = int(await conn.fetchval(_READ))
        await call(conn, leases)
        return int(await conn.fetchval(_READ)) - before
    finally:
        await conn.execute("ROLLBACK")


_JOBS = (
    "INSERT INTO jobqueue.jobs (id, type, payload, status, max_attempts, concurrency_key,"
    " run_at, attempts, locked_until)"
    " SELECT gen_random_uuid(), CASE WHEN g % 7 = 0 THEN 'report' ELSE 'sleep' END, '{{}}',"
    " '{status}', 3, CASE WHEN g % 2 = 0 THEN 'k' || (g % 100) END,"
    " now() - interval '1 minute' + g * interval '1 ms', {attempts}, {locked_until}"
    " FROM generate_series(1, {n}) AS g"
)


async def _insert(engine, n: int, status: str, leased: bool = False) -> None:
    sql = _JOBS.format(
        n=n,
        status=status,
        attempts=1 if leased else 0,
        locked_until="now() + interval '1 minute'" if leased else "NULL",
    )
    async with engine.begin() as conn:
        await conn.execute(sa.text(sql))


@pytest.mark.parametrize("analyzed", [True, False], ids=["quiet-statistics", "no-statistics"])
@pytest.mark.parametrize("name", sorted(CALLS))
async def test_a_call_planned_on_a_tiny_table_reads_about_its_rows_after_a_burst(
    engine, name, analyzed
):
    """A fresh table of 300 finished, 10 pending and 30 running jobs, no statistics; the call
    runs three times on one connection (its plan is made and kept), then 20,000 pending
    and 1,000 running jobs arrive: the same call on the same connection reads at most
    MOST_READ rows, where a plan for the tiny table (a sequential scan, every pending job
    fetched and sorted) reads the burst."""
    call = CALLS[name]
    await _insert(engine, 300, "completed")
    await _insert(engine, 10, "pending")
    await _insert(engine, 30, "processing", leased=True)
    async with engine.connect() as conn:
        raw = await driver(conn)
        if analyzed:
            await raw.execute("ANALYZE jobqueue.jobs")
        for _ in range(3):
            await _rows_read(raw, call)
        await _insert(engine, BURST, "pending")
        await _insert(engine, RUNNING, "processing", leased=True)
        read = await _rows_read(raw, call)
    assert read <= MOST_READ, read
