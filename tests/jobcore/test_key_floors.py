"""Key floors (`jobcore.floors.ClaimFloors`, keys in turn): while reading the claim index from
its head is costly, a claim looks for each key its process served and reads that key's jobs
from the key's floor, so the dead entries a held MVCC horizon keeps of a key's claimed jobs
cost nothing but a sweep or a check of the heads; no job is left behind or taken twice."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from jobcore import compiled, queries
from jobcore import floors as floors_module
from jobcore.floors import ClaimFloors, Sweeps, check_cost, micros
from jobcore.ids import new_id
from jobcore.runner import Compiled
from jobcore.states import Operation
from jobcore.turns import KeyTurns
from tests.jobcore.test_floors import until_drained
from tests.pg import driver, entries_read

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def taken(key: str | None, run_at: datetime, priority: int = 0) -> Any:
    return SimpleNamespace(queue="q", priority=priority, run_at=run_at, concurrency_key=key)


def costly() -> ClaimFloors:
    """Floors whose last check of the heads read past dead entries (a held horizon): claims
    send keys, and do not sweep."""
    floors = ClaimFloors()
    floors.checked(1.0, 0.0, keys=0, heads=1, entries=1000)
    return floors


# --- the bookkeeping ------------------------------------------------------------


def test_a_keys_floor_rises_to_the_last_job_of_it_taken_and_only_a_sweep_lowers_it():
    floors = costly()
    floors.learn_keys([taken("a", T0), taken("a", T0 + 9 * SECOND), taken(None, T0)], sweep=False)
    assert floors.key_floor("q", 0, "a") == micros(T0 + 8 * SECOND)
    assert floors.key_floor("q", 0, "") is None  # the key-less jobs are `learn`'s
    floors.learn_keys([taken("a", T0)], sweep=False)  # one another claim held, say
    assert floors.key_floor("q", 0, "a") == micros(T0 + 8 * SECOND)
    floors.learn_keys([taken("a", T0)], sweep=True)
    assert floors.key_floor("q", 0, "a") == micros(T0 - SECOND)


def test_the_keys_floors_are_sent_only_while_the_checks_read_past_dead_entries():
    floors = ClaimFloors()
    floors.learn_keys([taken("a", T0, priority=2)], sweep=False)
    assert floors.params(["q"], sweep=False)["key_floor_keys"] == []  # cheap: from the head
    floors.sweeps.done(0.0, 0.5)  # a costly sweep: a claim, whose cost says nothing of that
    floors.checked(0.5, 1.0, keys=1, heads=2, entries=4)  # a slow check, no dead entries
    assert floors.params(["q"], sweep=False)["key_floor_keys"] == []
    floors.checked(0.5, 2.0, keys=1, heads=2, entries=400)  # past dead entries
    sent = floors.params(["q"], sweep=False)
    assert (sent["key_floor_queues"], sent["key_floor_priorities"]) == (["q"], [2])
    assert (sent["key_floor_keys"], sent["key_floors"]) == (["a"], [micros(T0 - SECOND)])
    assert floors.params(["q"], sweep=True)["key_floor_keys"] == []
    assert floors.params(["other"], sweep=False)["key_floor_keys"] == []
    assert floors.keys(["q"]) == {k: v for k, v in sent.items() if k.startswith("key_floor")}


def test_a_process_keeps_the_floors_of_the_keys_it_served_last(monkeypatch):
    monkeypatch.setattr(floors_module, "KNOWN_KEYS", 3)
    floors = costly()
    for key in "abcd":
        floors.learn_keys([taken(key, T0)], sweep=False)
    assert floors.key_floor("q", 0, "a") is None
    floors.learn_keys([taken("b", T0)], sweep=False)  # served again: now the last
    floors.learn_keys([taken("e", T0)], sweep=False)
    assert [k for k in "abcde" if floors.key_floor("q", 0, k) is not None] == ["b", "d", "e"]


def test_a_check_of_the_heads_lowers_a_known_keys_floor_and_learns_no_new_key():
    floors = costly()
    floors.learn([taken(None, T0 + 60 * SECOND)], sweep=False)
    floors.learn_keys([taken("a", T0 + 60 * SECOND)], sweep=False)
    floors.lower([taken("a", T0), taken("b", T0)])
    assert floors.key_floor("q", 0, "a") == micros(T0)
    assert floors.key_floor("q", 0, "b") is None
    assert floors.floor("q", 0) == T0 + 59 * SECOND  # a key's job says nothing of key-less ones
    floors.lower([taken("a", T0 + 90 * SECOND)])
    assert floors.key_floor("q", 0, "a") == micros(T0)


def test_a_claim_that_read_its_floors_before_a_check_lowered_them_does_not_raise_them():
    """A check of the heads runs while a claim does: what the check found stays below the
    floors the claim would set, key-less or of a key, until the next claim after it."""
    floors = costly()
    floors.learn([taken(None, T0)], sweep=False)
    floors.learn_keys([taken("a", T0)], sweep=False)
    since = floors.generation  # a claim reads its floors
    floors.lower([taken(None, T0 - 60 * SECOND), taken("a", T0 - 60 * SECOND)])
    floors.learn([taken(None, T0 + 9 * SECOND)], sweep=False, since=since)
    floors.learn_keys([taken("a", T0 + 9 * SECOND)], sweep=True, since=since)
    assert floors.floor("q", 0) == T0 - 60 * SECOND
    assert floors.key_floor("q", 0, "a") == micros(T0 - 60 * SECOND)
    since = floors.generation  # the next claim, after the check
    floors.learn([taken(None, T0 + 9 * SECOND)], sweep=False, since=since)
    floors.learn_keys([taken("a", T0 + 9 * SECOND)], sweep=False, since=since)
    assert floors.floor("q", 0) == T0 + 8 * SECOND
    assert floors.key_floor("q", 0, "a") == micros(T0 + 8 * SECOND)


def test_a_check_that_reads_many_keys_heads_is_judged_per_hundred_of_them():
    assert check_cost(0.004, 0) == check_cost(0.004, 100) == 0.004
    assert check_cost(0.004, 256) == pytest.approx(0.004 * 100 / 256)


# --- on PostgreSQL ----------------------------------------------------------------


async def insert(engine, keys: int, per_key: int, *, run_at: str = "now()") -> None:
    """`per_key` pending jobs of each of `keys` keys (k00, k01, ...), due at `run_at` (SQL,
    `i` numbering each key's jobs from 1)."""
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO jobqueue.jobs (id, type, queue, payload, max_attempts,"
                " concurrency_key, run_at)"
                " SELECT gen_random_uuid(), 'sleep', 'q', '{}', 3, 'k' || lpad(k::text, 2, '0'),"
                f" {run_at} FROM generate_series(0, {keys - 1}) AS k,"
                f" generate_series(1, {per_key}) AS i"
            )
        )


async def claim(
    engine,
    floors: ClaimFloors,
    turns: KeyTurns,
    n: int,
    *,
    sweep: bool = False,
    key_limit: int | None = None,
) -> list[Any]:
    """A claim of `n` jobs of queue `q` (under KEY_CONCURRENCY `key_limit`), from which
    the floors and turns learn."""
    async with engine.connect() as conn:
        jobs = await compiled.claim(
            await driver(conn),
            {"q": n},
            60,
            floors=floors.params(["q"], sweep=sweep),
            turns=turns.params(["q"]),
            key_limits=None if key_limit is None else {"q": key_limit},
        )
        await conn.commit()
    floors.learn([job for job in jobs if job.concurrency_key is None], sweep=sweep)
    floors.learn_keys(jobs, sweep=sweep)
    turns.learn(jobs)
    return jobs


async def complete(engine, jobs: list[Any]) -> None:
    async with engine.connect() as conn:
        await compiled.record(await driver(conn), Operation.COMPLETE, [job.lease for job in jobs])
        await conn.commit()


async def read_by_a_claim(
    engine, floors: dict[str, Any], turns: KeyTurns, index: str = "jobqueue.jobs_claim_key_idx"
) -> tuple[int, set]:
    """Entries of `index` (the claim index) a claim of 30 reads (dead ones included), and
    what it takes, in a transaction rolled back."""
    keyed = bool(floors.get("key_floor_keys"))
    sql = Compiled(queries.JOB_CLAIM_KEY_FLOORS if keyed else queries.JOB_CLAIM)
    params = {
        "queues": ["q"],
        "slots": [30],
        "lease_seconds": 60.0,
        "claim": new_id(),
        "holder": "key-floor-host:1",
        "key_limits": [None],
        **compiled.NO_OVERRUNS,
        **turns.params(["q"]),
        **floors,
    }
    took: set = set()

    async def run(raw: Any) -> None:
        took.update(row["id"] for row in await raw.fetch(sql.sql, *sql.args(params)))

    return await entries_read(engine, index, run), took


async def test_under_a_held_horizon_a_keyed_claim_reads_only_past_its_keys_floors(engine):
    """3,000 jobs of 30 keys pass through while a transaction holds the horizon: their dead
    entries stay in the claim index. A claim of a job of each key from the head reads every
    one of them; one from the keys' floors reads about one entry a key, and takes the same
    jobs."""
    async with engine.connect() as holder:
        await holder.execute(sa.text("SELECT txid_current()"))  # held until the block ends
        # Each key's jobs due one every 3 s over the last 5 minutes: the 1 s margin spans one.
        await insert(engine, 30, 100, run_at="now() - interval '301 seconds' + i * interval '3 s'")
        floors, turns = costly(), KeyTurns()
        while jobs := await claim(engine, floors, turns, 25):
            await complete(engine, jobs)
        await insert(engine, 30, 1)
        sweep, swept = await read_by_a_claim(engine, compiled.NO_FLOORS, turns)
        floored, took = await read_by_a_claim(engine, floors.params(["q"], sweep=False), turns)
        await holder.rollback()
    assert sweep > 3000, sweep  # the dead entries are there: the test can tell
    assert floored < 100, (floored, sweep)
    assert took == swept and len(took) == 30


async def test_the_checks_of_the_heads_tell_a_held_horizon_from_a_busy_table(engine):
    """The keys' floors are sent once a check of the heads reads past dead entries to find
    them: not while 3,000 jobs of 30 keys are pending, only once they have run and moved
    on under a held horizon."""

    async def check(floors: ClaimFloors) -> None:
        async with engine.connect() as conn:
            read = await compiled.check_heads(await driver(conn), ["q"], floors.keys(["q"]))
            await conn.commit()
        floors.checked(
            0.001,
            0.0,
            keys=len(floors.keys(["q"])["key_floor_keys"]),
            heads=len(read.heads),
            entries=read.entries,
        )

    floors, turns = ClaimFloors(), KeyTurns()
    async with engine.connect() as holder:
        await holder.execute(sa.text("SELECT txid_current()"))  # held until the block ends
        await insert(engine, 30, 100, run_at="now() - interval '301 seconds' + i * interval '3 s'")
        await claim(engine, floors, turns, 30)
        await check(floors)
        assert floors.params(["q"], sweep=False)["key_floor_keys"] == []
        while jobs := await claim(engine, floors, turns, 25):
            await complete(engine, jobs)
        await insert(engine, 30, 1)
        await check(floors)
        assert len(floors.params(["q"], sweep=False)["key_floor_keys"]) == 30
        await holder.rollback()


async def test_known_keys_without_jobs_are_passed_over_and_the_keys_still_take_turns(engine):
    """Keys the process knows (k01, k03: served, then emptied) and keys it does not (k00,
    k02, k04) interleave: a claim takes from each in turn, a known key's new jobs included;
    a known key's job below its floor waits for a check of the heads."""
    floors, turns = costly(), KeyTurns()
    for key in ("k01", "k03"):
        await _insert_key(engine, key, "now()")
    assert len(await claim(engine, floors, turns, 5)) == 2
    assert floors.keys(["q"])["key_floor_keys"] == ["k01", "k03"]
    await insert(engine, 5, 2)  # due now: past the known keys' floors (1 s below then)
    await _insert_key(engine, "k03", "now() - interval '1 hour'")  # below k03's floor
    turns = KeyTurns()  # from the first key again
    got = await claim(engine, floors, turns, 5)
    assert sorted(job.concurrency_key for job in got) == ["k00", "k01", "k02", "k03", "k04"]
    got += await claim(engine, floors, turns, 10)
    assert sorted(job.concurrency_key for job in got) == sorted(
        2 * ["k00", "k01", "k02", "k03", "k04"]
    )
    assert all(job.run_at > datetime.now(UTC) - timedelta(minutes=1) for job in got)
    assert await claim(engine, floors, turns, 10) == []
    async with engine.connect() as conn:
        heads = await compiled.claim_heads(await driver(conn), ["q"], floors.keys(["q"]))
        await conn.commit()
    floors.lower(heads)
    (late,) = await claim(engine, floors, turns, 10)
    assert late.concurrency_key == "k03" and late.run_at < datetime.now(UTC) - timedelta(minutes=59)


async def test_a_known_key_without_jobs_first_in_turn_takes_no_slot(engine):
    """One slot, and the first key in turn a known one with no jobs left: the claim passes
    over it and takes the next key's job."""
    floors, turns = costly(), KeyTurns()
    await _insert_key(engine, "k00", "now()")
    assert len(await claim(engine, floors, turns, 1)) == 1
    await _insert_key(engine, "k01", "now()")
    (got,) = await claim(engine, floors, KeyTurns(), 1)  # from the first key: k00, empty
    assert got.concurrency_key == "k01"


async def test_key_concurrency_holds_for_keys_read_from_their_floors(engine):
    """Three known keys, three jobs each, KEY_CONCURRENCY 1: a claim of six takes one of
    each, and the next none."""
    floors, turns = costly(), KeyTurns()
    await insert(engine, 3, 1)
    got = await claim(engine, floors, turns, 6)
    await complete(engine, got)
    await insert(engine, 3, 3)

    assert floors.params(["q"], sweep=False)["key_floor_keys"] == ["k00", "k01", "k02"]
    got = await claim(engine, floors, turns, 6, key_limit=1)
    assert sorted(job.concurrency_key for job in got) == ["k00", "k01", "k02"]
    assert await claim(engine, floors, turns, 6, key_limit=1) == []


async def _insert_key(engine, key: str, run_at: str) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO jobqueue.jobs (id, type, queue, payload, max_attempts,"
                f" concurrency_key, run_at) VALUES (gen_random_uuid(), 'sleep', 'q', '{{}}', 3,"
                f" '{key}', {run_at})"
            )
        )


@pytest.mark.parametrize("found_by", ["sweeps", "checks"])
async def test_racing_keyed_claimers_with_floors_take_every_job_once_stragglers_included(
    engine, found_by
):
    """Four processes' worth of claimers, each with its own floors and turns, race over 1,000
    jobs of 20 keys while jobs of those keys due long ago keep arriving below their floors:
    found by the claims' sweeps, or (claims never sweeping and always sending their keys, as
    under a held horizon) by checks of the heads."""
    await insert(engine, 20, 50)
    expected = 1000 + 50
    claimed: list[Any] = []
    done = asyncio.Event()

    async def checks(floors: ClaimFloors) -> None:
        while not done.is_set():
            async with engine.connect() as conn:
                raw = await driver(conn)
                floors.lower(await compiled.claim_heads(raw, ["q"], floors.keys(["q"])))
                await conn.commit()
            await asyncio.sleep(0.05)

    async def claimer(seed: int) -> None:
        rng = random.Random(seed)
        floors = ClaimFloors(sweeps=Sweeps(cheap=-1.0))
        floors.checked(1.0, 0.0, keys=0, heads=1, entries=1000)  # floored claims send keys
        turns = KeyTurns()
        checking = asyncio.create_task(checks(floors)) if found_by == "checks" else None

        async def take() -> list[Any]:
            sweep = found_by == "sweeps" and rng.random() < 0.1
            return await claim(engine, floors, turns, rng.randint(1, 20), sweep=sweep)

        await until_drained(take, claimed, expected, done)
        if checking is not None:
            await checking

    async def stragglers() -> None:
        for _ in range(10):
            await insert(engine, 5, 1, run_at="now() - interval '10 minutes'")
            await asyncio.sleep(0.02)

    await asyncio.gather(stragglers(), *(claimer(seed) for seed in range(4)))
    assert len(claimed) == len(set(claimed)) == expected


# --- KEY_CONCURRENCY's running count, from the key lease floor ---------------------------


async def test_under_a_held_horizon_key_concurrency_counts_from_the_key_lease_floor(engine):
    """3,000 attempts of 30 keys, run in the hour before, end while a transaction holds the
    horizon: their dead entries stay among the keys' running jobs. A claim under
    KEY_CONCURRENCY counting from the head reads them all (twice: before each key's lock and
    after); from the key lease floor it reads none of them (an entry a key at most), and
    takes the same jobs."""
    async with engine.connect() as holder:
        await holder.execute(sa.text("SELECT txid_current()"))  # held until the block ends
        async with engine.begin() as conn:
            await conn.execute(
                sa.text(
                    "INSERT INTO jobqueue.jobs (id, type, queue, payload, max_attempts, status,"
                    " attempts, lease_token, concurrency_key, locked_until)"
                    " SELECT gen_random_uuid(), 'sleep', 'q', '{}', 3, 'processing', 1, 1,"
                    " 'k' || lpad(k::text, 2, '0'), now() - interval '1 hour' + i * interval '1 s'"
                    " FROM generate_series(0, 29) AS k, generate_series(1, 100) AS i"
                )
            )
        async with engine.begin() as conn:
            await conn.execute(
                sa.text(
                    "UPDATE jobqueue.jobs SET status = 'completed', finished_at = now(),"
                    " locked_until = NULL"
                    " WHERE status = 'processing'"
                )
            )
        await insert(engine, 30, 2)
        floors, turns = ClaimFloors(), KeyTurns()
        async with engine.connect() as conn:
            floors.learn_key_leases(await compiled.key_lease_first(await driver(conn), ["q"]))
            await conn.commit()
        keyed = {"key_limits": [1]}
        lease_index = "jobqueue.jobs_key_lease_idx"
        sent = floors.params(["q"], sweep=False)
        head, from_head = await read_by_a_claim(
            engine, {**sent, "key_lease_floor": None, **keyed}, turns, index=lease_index
        )
        floored, took = await read_by_a_claim(engine, {**sent, **keyed}, turns, index=lease_index)
        await holder.rollback()
    assert head >= 6000, head  # the dead entries are there: the test can tell
    assert floored <= 60, (floored, head)  # at most one a count, whatever the dead
    assert took == from_head and len(took) == 30


async def test_a_lease_that_ran_out_still_counts_against_its_key_until_recovered(engine):
    """A job of k00 still running on a lease that ran out an hour ago (its worker stalled,
    recovery not yet there): the key lease floor lies below it, so KEY_CONCURRENCY 1 leaves
    k00 no room, while k01 takes its turn."""
    await insert(engine, 2, 2)
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO jobqueue.jobs (id, type, queue, payload, max_attempts, status,"
                " attempts, lease_token, concurrency_key, locked_until) VALUES"
                " (gen_random_uuid(), 'sleep', 'q', '{}', 3, 'processing', 1, 1, 'k00',"
                " now() - interval '1 hour')"
            )
        )
    floors = costly()
    async with engine.connect() as conn:
        floors.learn_key_leases(await compiled.key_lease_first(await driver(conn), ["q"]))
        await conn.commit()
    assert floors.params(["q"], sweep=False)["key_lease_floor"] < micros(
        datetime.now(UTC) - timedelta(minutes=60)
    )
    got = await claim(engine, floors, KeyTurns(), 4, key_limit=1)
    assert [job.concurrency_key for job in got] == ["k01"]
