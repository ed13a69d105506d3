"""Claim floors (`jobcore.floors`): a claim reads the claim index from where its process
left off, so the dead entries a held MVCC horizon keeps cost nothing but a sweep, and no
job is left behind or taken twice."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from jobcore import compiled, queries
from jobcore.floors import (
    LEASE_MARGIN,
    NO_KEYS,
    ClaimFloors,
    Sweeps,
    TypeFloors,
    check_interval,
    micros,
)
from jobcore.ids import new_id
from jobcore.runner import Compiled
from jobcore.states import Operation
from tests.pg import driver, entries_read

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def taken(queue: str, priority: int, run_at: datetime, key: str | None = None) -> Any:
    return SimpleNamespace(queue=queue, priority=priority, run_at=run_at, concurrency_key=key)


# --- the bookkeeping ------------------------------------------------------------


def test_a_floor_rises_to_the_latest_job_taken_less_the_margin_per_queue_and_priority():
    floors = ClaimFloors(margin=SECOND)
    floors.learn(
        [taken("a", 0, T0), taken("a", 0, T0 + 5 * SECOND), taken("a", 3, T0)], sweep=False
    )
    assert floors.floor("a", 0) == T0 + 4 * SECOND
    assert floors.floor("a", 3) == T0 - SECOND
    assert floors.floor("b", 0) is None


def test_only_a_sweep_lowers_a_floor():
    floors = ClaimFloors(margin=SECOND)
    floors.learn([taken("a", 0, T0 + 10 * SECOND)], sweep=False)
    floors.learn([taken("a", 0, T0)], sweep=False)  # a job another claim held, say
    assert floors.floor("a", 0) == T0 + 9 * SECOND
    floors.learn([taken("a", 0, T0)], sweep=True)  # found below the floor: more may be
    assert floors.floor("a", 0) == T0 - SECOND


def test_a_sweep_forgets_the_floors_above_what_it_took_in_the_queues_it_read():
    """Priorities 9 and 5 drained (the sweep read them from the head and took nothing
    there); 1 still had jobs, and 0, below what the sweep took, keeps its floor; queue b,
    which the sweep did not read, keeps every floor, and so does queue c, where it took
    nothing (empty for a moment, say)."""
    floors = ClaimFloors(margin=SECOND)
    early = [taken(q, p, T0) for q in ("a", "b", "c") for p in (9, 5, 1, 0)]
    floors.learn(early, sweep=False)
    floors.learn([taken("a", 1, T0 + 3 * SECOND)], sweep=True)
    assert [p for p in (9, 5, 1, 0) if floors.floor("a", p)] == [1, 0]
    assert floors.floor("a", 1) == T0 + 2 * SECOND
    assert floors.floor("a", 0) == T0 - SECOND
    assert [p for p in (9, 5, 1, 0) if floors.floor("b", p)] == [9, 5, 1, 0]
    assert [p for p in (9, 5, 1, 0) if floors.floor("c", p)] == [9, 5, 1, 0]
    assert floors.params(["a"], sweep=False)["floor_priorities"] == [1, 0]


def test_a_sweep_sends_no_floors_and_a_claim_only_those_of_its_queues():
    floors = ClaimFloors(margin=SECOND)
    floors.learn([taken("a", 0, T0), taken("b", 2, T0)], sweep=False)
    assert floors.params(["a", "b"], sweep=True) == compiled.NO_FLOORS
    assert floors.params(["b"], sweep=False) == {
        "floor_queues": ["b"],
        "floor_priorities": [2],
        "floors": [micros(T0 - SECOND)],
        **NO_KEYS,
        "key_lease_floor": None,
    }


def test_sweeps_are_paced_by_their_cost_and_never_further_apart_than_the_cap():
    sweeps = Sweeps(ratio=20, max_interval=5.0, cheap=10.0)
    assert sweeps.due(0.0)
    sweeps.done(started=0.0, ended=0.01)  # 10 ms: the next one 200 ms later
    assert not sweeps.due(0.2)
    assert sweeps.due(0.2101)
    sweeps.done(started=1.0, ended=2.0)  # 1 s: 20 s by its cost, 5 s by the cap
    assert not sweeps.due(6.9)
    assert sweeps.due(7.0)


def test_claims_stop_sweeping_once_reading_from_the_head_is_costly_and_resume_after():
    sweeps = Sweeps(ratio=20, max_interval=5.0, cheap=0.005)
    sweeps.done(started=0.0, ended=0.002)
    assert sweeps.due(1.0)
    sweeps.measured(0.120, at=1.0)  # a check of the heads under a held horizon
    assert not sweeps.due(5.0)
    sweeps.measured(0.130, at=5.0)
    assert not sweeps.due(14.9)
    assert sweeps.due(15.0)  # no check for 10 s: the claims look themselves
    sweeps.measured(0.001, at=16.0)  # the horizon moved on and vacuum ran
    assert sweeps.due(16.0)


def test_the_heads_are_checked_every_second_to_every_5_s_by_their_cost():
    assert check_interval(0.001) == 1.0
    assert check_interval(0.1) == 2.0
    assert check_interval(3.0) == 5.0


def test_a_check_of_the_heads_lowers_a_floor_a_due_job_lies_below_and_never_raises_one():
    floors = ClaimFloors(margin=SECOND)
    floors.learn([taken("a", 0, T0 + 10 * SECOND)], sweep=False)
    floors.lower([taken("a", 0, T0 + 60 * SECOND)])  # the frontier, above the floor
    assert floors.floor("a", 0) == T0 + 9 * SECOND
    floors.lower([taken("a", 0, T0), taken("a", 7, T0 + 5 * SECOND)])
    assert floors.floor("a", 0) == T0
    assert floors.floor("a", 7) == T0 + 5 * SECOND  # a priority first seen here


# --- on PostgreSQL ----------------------------------------------------------------


async def insert(
    engine, rows: int, *, queue: str = "default", priority: int = 0, run_at: str = "now()"
) -> None:
    """`rows` pending jobs, due at `run_at` (SQL, `i` numbering them from 1)."""
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO jobqueue.jobs (id, type, queue, payload, max_attempts, priority,"
                f" run_at) SELECT gen_random_uuid(), 'sleep', '{queue}', '{{}}', 3, {priority},"
                f" {run_at} FROM generate_series(1, {rows}) AS i"
            )
        )


async def _claim(engine, floors: ClaimFloors, n: int, *, sweep: bool) -> list[Any]:
    async with engine.connect() as conn:
        raw = await driver(conn)
        jobs = await compiled.claim(
            raw, {"default": n}, 60, floors=floors.params(["default"], sweep=sweep)
        )
        await conn.commit()
    floors.learn(jobs, sweep=sweep)
    return jobs


async def test_a_floored_claim_leaves_a_job_below_its_floor_to_the_next_sweep(engine):
    floors = ClaimFloors()
    await insert(engine, 1)
    assert len(await _claim(engine, floors, 5, sweep=True)) == 1
    # Handed back, recovered or committed late: below the floor the first claim set.
    await insert(engine, 1, run_at="now() - interval '1 hour'")
    assert await _claim(engine, floors, 5, sweep=False) == []
    (found,) = await _claim(engine, floors, 5, sweep=True)
    assert found.run_at < datetime.now(UTC) - timedelta(minutes=59)


async def test_a_check_of_the_heads_finds_a_job_below_a_floor_for_the_next_claim(engine):
    floors = ClaimFloors()
    await insert(engine, 1)
    assert len(await _claim(engine, floors, 5, sweep=True)) == 1
    await insert(engine, 2, run_at="now() - interval '1 hour'")
    await insert(engine, 1, priority=3, run_at="now() - interval '2 hours'")
    assert await _claim(engine, floors, 5, sweep=False) != []  # the new priority: a gap
    async with engine.connect() as conn:
        heads = await compiled.claim_heads(await driver(conn), ["default"])
        await conn.commit()
    assert sorted(head.priority for head in heads) == [0]
    floors.lower(heads)
    got = await _claim(engine, floors, 5, sweep=False)
    assert len(got) == 2 and all(job.priority == 0 for job in got)


async def test_a_floored_claim_still_takes_the_highest_priority_first(engine):
    """Priorities the process has not seen yet are probed in the gaps between the known
    ones: above, between and below them."""
    floors = ClaimFloors()
    await insert(engine, 3, priority=0)
    await insert(engine, 3, priority=10)
    assert {job.priority for job in await _claim(engine, floors, 6, sweep=True)} == {0, 10}
    for priority in (5, 20, -4):
        await insert(engine, 2, priority=priority)
    await insert(engine, 2, priority=0)
    got = await _claim(engine, floors, 3, sweep=False)
    assert sorted(job.priority for job in got) == [5, 20, 20]
    got = await _claim(engine, floors, 10, sweep=False)
    assert sorted(job.priority for job in got) == [-4, -4, 0, 0, 5]


async def _entries_read(engine, floors: dict[str, list[Any]]) -> int:
    """Claim index entries a claim reads, dead ones included (each one the scan returns,
    whether its row turns out visible or not), counted for its transaction, rolled back."""
    sql = Compiled(queries.JOB_CLAIM)
    params = {
        "queues": ["default"],
        "slots": [10],
        "lease_seconds": 60.0,
        "claim": new_id(),
        "holder": "floor-host:1",
        "key_limits": [],
        **compiled.NO_OVERRUNS,
        **compiled.NO_TURNS,
    }

    async def claim(raw: Any) -> None:
        await raw.fetch(sql.sql, *sql.args({**params, **floors}))

    return await entries_read(engine, "jobqueue.jobs_claim_key_idx", claim)


async def test_under_a_held_horizon_a_floored_claim_reads_only_past_its_floor(engine):
    """3,000 jobs pass through while a transaction holds the horizon: their dead entries
    stay in the claim index. A sweep reads every one of them; a floored claim reads what
    lies within the margin of its floor."""
    async with engine.connect() as holder:
        await holder.execute(sa.text("SELECT txid_current()"))  # held until the block ends
        # Due one every 100 ms over the last 5 minutes, so the 1 s margin spans 10 of them.
        await insert(engine, 3000, run_at="now() - interval '301 seconds' + i * interval '100 ms'")
        floors = ClaimFloors()
        while jobs := await _claim(engine, floors, 25, sweep=False):
            async with engine.connect() as conn:
                raw = await driver(conn)
                await compiled.record(raw, Operation.COMPLETE, [job.lease for job in jobs])
                await conn.commit()
        await insert(engine, 10)
        sweep = await _entries_read(engine, compiled.NO_FLOORS)
        floored = await _entries_read(engine, floors.params(["default"], sweep=False))
        await holder.rollback()
    assert sweep > 3000, sweep  # the dead entries are there: the test can tell
    assert floored < 40, (floored, sweep)


async def until_drained(
    take: Callable[[], Awaitable[list[Any]]], claimed: list[Any], expected: int, done: asyncio.Event
) -> None:
    """Run `take()` (a claim: the jobs it took) until `claimed`, shared by the racing
    claimers, holds `expected` jobs, then set `done`; fail if it takes nothing for 10 s
    while some are still missing."""
    loop = asyncio.get_running_loop()
    idle_since: float | None = None
    while True:
        jobs = await take()
        claimed.extend(job.id for job in jobs)
        if jobs:
            idle_since = None
        elif len(claimed) >= expected:
            done.set()
            return
        elif idle_since is None:
            idle_since = loop.time()
        elif loop.time() - idle_since > 10:
            raise AssertionError("jobs left behind")
        await asyncio.sleep(0)


@pytest.mark.parametrize("found_by", ["sweeps", "checks"])
async def test_racing_claimers_with_floors_take_every_job_once_stragglers_included(
    engine, found_by
):
    """Four processes' worth of claimers, each with its own floors, race over 1,500 jobs
    while jobs due long ago keep arriving below their floors: found by the claims'
    sweeps, or (claims never sweeping, as under a held horizon) by checks of the heads."""
    await insert(engine, 1500)
    expected = 1500
    claimed: list[Any] = []
    done = asyncio.Event()

    async def checks(floors: ClaimFloors) -> None:
        while not done.is_set():
            async with engine.connect() as conn:
                floors.lower(await compiled.claim_heads(await driver(conn), ["default"]))
                await conn.commit()
            await asyncio.sleep(0.05)

    async def claimer(seed: int) -> None:
        rng = random.Random(seed)
        cheap = 10.0 if found_by == "sweeps" else -1.0
        floors = ClaimFloors(sweeps=Sweeps(ratio=20, max_interval=0.2, cheap=cheap))
        checking = asyncio.create_task(checks(floors)) if found_by == "checks" else None
        loop = asyncio.get_running_loop()

        async def take() -> list[Any]:
            sweep = floors.sweeps.due(loop.time())
            started = loop.time()
            jobs = await _claim(engine, floors, rng.randint(1, 20), sweep=sweep)
            if sweep:
                floors.sweeps.done(started, loop.time())
            return jobs

        await until_drained(take, claimed, expected, done)
        if checking is not None:
            await checking

    async def stragglers() -> None:
        for _ in range(10):
            await insert(engine, 5, run_at="now() - interval '10 minutes'")
            await asyncio.sleep(0.02)

    expected += 50
    await asyncio.gather(stragglers(), *(claimer(seed) for seed in range(4)))
    assert len(claimed) == len(set(claimed)) == expected


# --- recovery reads recent expiries, and sweeps ---------------------------------


async def _expired_lease(engine, ago: str) -> Any:
    job_id = new_id()
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO jobqueue.jobs (id, type, payload, max_attempts, status, attempts,"
                " lease_token, locked_until) VALUES (:id, 'sleep', '{}', 3, 'processing', 1, 1,"
                f" now() - interval '{ago}')"
            ),
            {"id": job_id},
        )
    return job_id


async def test_recovery_with_a_window_takes_only_leases_that_ran_out_within_it(engine):
    old = await _expired_lease(engine, "1 hour")
    recent = await _expired_lease(engine, "2 seconds")
    async with engine.connect() as conn:
        raw = await driver(conn)
        windowed = await compiled.recover_expired(raw, window=60.0)
        swept = await compiled.recover_expired(raw, window=None)
        await conn.commit()
    assert [job_id for job_id, _ in windowed] == [recent]
    assert [job_id for job_id, _ in swept] == [old]


# --- the limited types' floors ----------------------------------------------------------------


def typed(type: str, queue: str, priority: int, run_at: datetime) -> Any:
    return SimpleNamespace(type=type, queue=queue, priority=priority, run_at=run_at)


def test_each_limited_type_has_its_own_claim_floors_learnt_from_its_own_jobs():
    floors = TypeFloors(["mail", "report"])
    floors.learn([typed("mail", "default", 0, T0 + 5 * SECOND)], {}, sweep=False)
    sent = floors.params(["default"], sweep=False)
    assert sent["type_floor_types"] == ["mail"]
    assert sent["type_floors"] == [micros(T0 + 4 * SECOND)]
    assert sent["lease_floors"] == [None, None]  # from the head until a claim counted
    assert floors.params(["other"], sweep=False)["type_floors"] == []  # floors per queue


def test_a_lease_floor_lies_the_lease_margin_below_the_earliest_lease_counted_and_only_rises():
    floors = TypeFloors(["mail"])
    margin = LEASE_MARGIN // timedelta(microseconds=1)
    floors.learn([], {"mail": micros(T0)}, sweep=True)
    assert floors.params([], sweep=False)["lease_floors"] == [micros(T0) - margin]
    floors.learn([], {"mail": micros(T0 - 5 * SECOND)}, sweep=False)
    assert floors.params([], sweep=False)["lease_floors"] == [micros(T0) - margin]
    floors.learn([], {"mail": micros(T0 - 5 * SECOND)}, sweep=True)  # a sweep's may fall
    assert floors.params([], sweep=False)["lease_floors"] == [micros(T0 - 5 * SECOND) - margin]
    assert floors.params([], sweep=True)["lease_floors"] == [None]


def test_a_check_of_the_heads_lowers_only_the_limited_floors_that_are_set():
    floors = TypeFloors(["mail"])
    floors.learn([typed("mail", "default", 0, T0)], {}, sweep=False)
    floors.lower([taken("default", 0, T0 - 60 * SECOND), taken("default", 3, T0 - 60 * SECOND)])
    sent = floors.params(["default"], sweep=False)
    # A keyed job of the type may lie below a head of priority 3: that one stays unfloored.
    assert list(zip(sent["type_floor_priorities"], sent["type_floors"], strict=True)) == [
        (0, micros(T0 - 60 * SECOND))
    ]
