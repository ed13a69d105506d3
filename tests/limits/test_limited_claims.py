"""Per-type limits at claim time, on real PostgreSQL: claimers on several connections never
hold more of a type than its TYPE_CONCURRENCY, never start more than its TYPE_RATE per
window, and never stop other types from being claimed."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from typing import Any

import pytest
import sqlalchemy as sa

from jobcore import compiled
from jobcore.floors import TypeFloors
from jobcore.ids import new_id
from jobcore.rows import NewJob, TypeLimits
from jobcore.states import Operation
from jobcore.store import submit_many
from tests.pg import driver, entries_read

LEASE = 60.0


async def _add(engine, type: str, count: int, **fields) -> None:
    async with engine.begin() as conn:
        await submit_many(conn, [NewJob(new_id(), type, {}, 3, **fields) for _ in range(count)])


async def _count(engine, sql: str) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(sa.text(sql))).scalar_one())


@pytest.mark.parametrize("floored", [False, True], ids=["from-the-head", "from-floors"])
async def test_concurrent_claimers_never_hold_more_of_a_type_than_its_limit(engine, floored):
    """From floors (`jobcore.floors.TypeFloors`), each claimer reads the type's jobs and
    running leases from where its own last claim found them, as a worker process does."""
    await _add(engine, "limited", 60)
    limits = TypeLimits(concurrency={"limited": 3})
    most = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal most
        async with engine.connect() as conn:
            while not done.is_set():
                n = (
                    await conn.execute(
                        sa.text(
                            "SELECT count(*) FROM jobqueue.jobs"
                            " WHERE status = 'processing' AND type = 'limited'"
                        )
                    )
                ).scalar_one()
                await conn.commit()
                most = max(most, n)

    async def claimer() -> int:
        taken = 0
        floors = TypeFloors(limits.types)
        sweep = True  # the first claim; from floors after it
        async with engine.connect() as conn:
            raw = await driver(conn)
            while True:
                got = await compiled.claim_limited(
                    raw,
                    limits,
                    {"default": 2},
                    LEASE,
                    type_floors=floors.params(["default"], sweep=sweep) if floored else None,
                )
                floors.learn(got.jobs, got.running, sweep=sweep)
                sweep = False
                assert len(got.jobs) <= 3
                taken += len(got.jobs)
                if got.jobs:
                    await asyncio.sleep(random.uniform(0, 0.01))
                    lost = await compiled.record(
                        raw, Operation.COMPLETE, [job.lease for job in got.jobs]
                    )
                    assert lost == []
                elif (
                    await _count(
                        engine, "SELECT count(*) FROM jobqueue.jobs WHERE status = 'pending'"
                    )
                    == 0
                ):
                    return taken

    watcher = asyncio.create_task(watch())
    taken = await asyncio.wait_for(asyncio.gather(*(claimer() for _ in range(8))), 60)
    done.set()
    await watcher
    assert sum(taken) == 60
    assert 1 <= most <= 3
    assert (
        await _count(engine, "SELECT count(*) FROM jobqueue.jobs WHERE status = 'completed'") == 60
    )


async def test_a_rate_limited_type_never_starts_more_than_its_rate_in_a_window(engine):
    await _add(engine, "mail", 200)
    limits = TypeLimits(rate={"mail": (5, 1.0)})
    per_window: Counter[int] = Counter()
    total = 0
    stop_at = time.time() + 3.5

    async def claimer() -> None:
        nonlocal total
        async with engine.connect() as conn:
            raw = await driver(conn)
            while time.time() < stop_at:
                before = time.time()
                got = await compiled.claim_limited(raw, limits, {"default": 10}, LEASE)
                after = time.time()
                total += len(got.jobs)
                # The database's clock is this machine's: a claim that began and ended in the
                # same second was counted in that second's window.
                if math.floor(before) == math.floor(after):
                    per_window[math.floor(before)] += len(got.jobs)
                if not got.jobs:
                    assert got.held == {"mail": "rate"}
                    assert got.wait is not None and 0 <= got.wait <= 1.0
                    # As the dispatcher does: try again once the next window has opened.
                    await asyncio.sleep(got.wait + random.uniform(0.002, 0.02))

    started = time.time()
    await asyncio.gather(*(claimer() for _ in range(6)))
    elapsed = time.time() - started
    assert max(per_window.values()) <= 5, per_window
    # Fixed windows: at most one window more than the seconds elapsed.
    assert 5 <= total <= 5 * (math.ceil(elapsed) + 1), (total, elapsed)
    assert sum(per_window.values()) >= 10  # windows did roll over and were used again


async def test_other_types_are_claimed_around_a_saturated_limited_type(engine):
    # 50 jobs of the limited type, due first and at a higher priority, ahead of the others.
    await _add(engine, "limited", 50, priority=10)
    await _add(engine, "other", 10)
    limits = TypeLimits(concurrency={"limited": 1})
    async with engine.connect() as conn:
        raw = await driver(conn)
        first = await compiled.claim_limited(raw, limits, {"default": 5}, LEASE)
        assert [job.type for job in first.jobs] == ["limited"]
        assert first.held == {"limited": "concurrency"}
        again = await compiled.claim_limited(raw, limits, {"default": 5}, LEASE)
        assert again.jobs == [] and again.held == {"limited": "concurrency"}
        others = await compiled.claim(raw, {"default": 6}, LEASE, limited=limits.types)
        assert [job.type for job in others] == ["other"] * 6
        lost, more = await compiled.complete_and_claim(
            raw, [job.lease for job in others], {"default": 6}, LEASE, limited=limits.types
        )
        assert lost == [] and [job.type for job in more] == ["other"] * 4
        # Without limits configured the ordinary claim takes the limited type in claim order.
        plain = await compiled.claim(raw, {"default": 2}, LEASE)
        assert [job.type for job in plain] == ["limited", "limited"]


async def test_a_limited_backlog_takes_no_slot_a_higher_priority_job_is_due_for(engine):
    await _add(engine, "limited", 40, priority=-100)
    await _add(engine, "urgent", 2, priority=100)
    await _add(engine, "later", 1, priority=-100, queue="default")
    limits = TypeLimits(concurrency={"limited": 10})
    async with engine.connect() as conn:
        raw = await driver(conn)
        got = await compiled.claim_limited(raw, limits, {"default": 4}, LEASE)
    # Claim order across both: the two urgent jobs, then the oldest two of priority -100,
    # both limited: only those are taken here, the urgent ones are left to the ordinary claim.
    assert Counter(job.type for job in got.jobs) == {"limited": 2}
    assert got.held == {}


async def test_a_handler_running_on_after_its_attempt_still_holds_its_unit(engine):
    await _add(engine, "limited", 5)
    limits = TypeLimits(concurrency={"limited": 2})
    async with engine.connect() as conn:
        raw = await driver(conn)
        held = await compiled.claim_limited(
            raw, limits, {"default": 5}, LEASE, overruns={"limited": 2}
        )
        assert held.jobs == [] and held.held == {"limited": "concurrency"}
        one = await compiled.claim_limited(
            raw, limits, {"default": 5}, LEASE, overruns={"limited": 1}
        )
        assert len(one.jobs) == 1


async def test_limited_claims_follow_claim_order_and_free_slots_per_queue(engine):
    await _add(engine, "a", 3, priority=1)
    await _add(engine, "b", 3, priority=5)
    await _add(engine, "a", 2, queue="bulk", priority=9)
    limits = TypeLimits(concurrency={"a": 4, "b": 2})
    async with engine.connect() as conn:
        raw = await driver(conn)
        got = await compiled.claim_limited(raw, limits, {"default": 3, "bulk": 1}, LEASE)
    by_queue = Counter((job.queue, job.type) for job in got.jobs)
    # default: b first (priority 5) up to its limit of 2, then one a; bulk: one a.
    assert by_queue == {("default", "b"): 2, ("default", "a"): 1, ("bulk", "a"): 1}
    assert got.held == {"b": "concurrency"}


async def test_a_spent_rate_window_opens_again_when_the_next_window_starts(engine):
    await _add(engine, "mail", 10)
    limits = TypeLimits(rate={"mail": (3, 1.0)})
    async with engine.connect() as conn:
        raw = await driver(conn)
        first = await compiled.claim_limited(raw, limits, {"default": 10}, LEASE)
        if len(first.jobs) < 3:  # the first window ended during the claim: start afresh
            await asyncio.sleep(1.0)
            first = await compiled.claim_limited(raw, limits, {"default": 10}, LEASE)
        assert len(first.jobs) == 3 and first.held == {"mail": "rate"}
        assert first.wait is not None and 0 <= first.wait <= 1.0
        await asyncio.sleep(first.wait + 0.01)
        second = await compiled.claim_limited(raw, limits, {"default": 10}, LEASE)
        assert len(second.jobs) == 3


async def test_a_lost_limited_claim_is_released_by_its_claim_id(engine):
    await _add(engine, "limited", 2)
    limits = TypeLimits(concurrency={"limited": 5})
    claim_id = new_id()
    async with engine.connect() as conn:
        raw = await driver(conn)
        got = await compiled.claim_limited(raw, limits, {"default": 5}, LEASE, claim_id)
        assert len(got.jobs) == 2
        released = await compiled.release_claim(raw, [claim_id])
    assert sorted(released) == sorted(job.id for job in got.jobs)


# --- under a held MVCC horizon ----------------------------------------------------------------


async def _entries(engine, floors: TypeFloors, index: str, *, sweep: bool) -> tuple[int, Any]:
    limits = TypeLimits(concurrency={"mail": 4})
    got: list[Any] = []

    async def claim(raw: Any) -> None:
        params = floors.params(["default"], sweep=sweep)
        got.append(
            await compiled.claim_limited(raw, limits, {"default": 10}, LEASE, type_floors=params)
        )

    return await entries_read(engine, f"jobqueue.{index}", claim), got[0]


async def test_under_a_held_horizon_a_limited_claim_reads_past_what_its_type_left_behind(engine):
    """3,000 jobs of a limited type ran and finished while a transaction holds the horizon:
    their pending and leased entries stay, dead, in the type's index and the lease index.
    A limited claim from the head visits each one; from its floors, next to none, and it
    counts the same running jobs."""
    async with engine.connect() as holder:
        await holder.execute(sa.text("SELECT txid_current()"))  # held until the block ends
        async with engine.begin() as conn:
            # Due one every 200 ms, the last 32 s ago; each lease ended a second after.
            await conn.execute(
                sa.text(
                    "INSERT INTO jobqueue.jobs (id, type, payload, max_attempts, run_at)"
                    " SELECT gen_random_uuid(), 'mail', '{}', 3,"
                    " now() - interval '632 s' + i * interval '200 ms'"
                    " FROM generate_series(1, 3000) AS i"
                )
            )
        for change in (
            "status = 'processing', attempts = 1, lease_token = 1,"
            " locked_until = run_at + interval '1 s'",
            "status = 'completed', locked_until = NULL, finished_at = now()",
        ):
            async with engine.begin() as conn:
                await conn.execute(sa.text(f"UPDATE jobqueue.jobs SET {change}"))
        await _add(engine, "mail", 6)
        floors = TypeFloors(["mail"])
        async with engine.connect() as conn:
            raw = await driver(conn)
            limits = TypeLimits(concurrency={"mail": 4})
            first = await compiled.claim_limited(
                raw,
                limits,
                {"default": 2},
                LEASE,
                type_floors=floors.params(["default"], sweep=True),
            )
            await conn.commit()
        assert len(first.jobs) == 2
        floors.learn(first.jobs, first.running, sweep=True)
        reads = {}
        for index in ("jobs_claim_type_idx", "jobs_lease_idx"):
            reads[index] = [await _entries(engine, floors, index, sweep=s) for s in (True, False)]
        await holder.rollback()
    for index, ((head, swept), (floor, floored)) in reads.items():
        assert head > 3000 and floor < 40, (index, head, floor)
        # Both take the 2 jobs the limit leaves room for, of the 4 left.
        assert len(swept.jobs) == len(floored.jobs) == 2, (swept, floored)
