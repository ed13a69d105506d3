"""Concurrency keys at claim time, on real PostgreSQL: keys take turns within a priority (one
key's backlog cannot hold up another key's jobs), the key-less jobs keep their order, and
KEY_CONCURRENCY holds across claimers on many connections."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from jobcore import compiled
from jobcore.ids import new_id
from jobcore.rows import TypeLimits
from jobcore.schema import jobs
from jobcore.states import Operation
from jobcore.turns import KeyTurns
from tests.pg import driver

LEASE = 60.0


async def _add(engine, count: int, key: str | None, *, start: datetime, **fields) -> list:
    """`count` due jobs of `key`, due one ms apart from `start` (submit order)."""
    rows = [
        {
            "id": new_id(),
            "type": "t",
            "payload": {"n": n},
            "max_attempts": 3,
            "concurrency_key": key,
            "run_at": start + timedelta(milliseconds=n),
            **fields,
        }
        for n in range(count)
    ]
    async with engine.begin() as conn:
        await conn.execute(sa.insert(jobs), rows)
    return [row["id"] for row in rows]


def _ago(seconds: float) -> datetime:
    return datetime.now(UTC) - timedelta(seconds=seconds)


async def _claim(engine, n: int, turns: KeyTurns, queue: str = "default", **kw) -> list:
    async with engine.connect() as conn:
        raw = await driver(conn)
        got = await compiled.claim(raw, {queue: n}, LEASE, turns=turns.params([queue]), **kw)
    turns.learn(got)
    return got


async def test_a_key_submitted_after_a_big_backlog_of_another_is_claimed_at_once(engine):
    """10,000 jobs of A due first, then 20 of B: claims of 16 share the slots between the
    two keys, and B is done within two claims while A keeps thousands."""
    await _add(engine, 10_000, "A", start=_ago(60))
    await _add(engine, 20, "B", start=_ago(30))
    turns = KeyTurns()
    first = await _claim(engine, 16, turns)
    second = await _claim(engine, 16, turns)
    keys = Counter(job.concurrency_key for job in first + second)
    assert keys["B"] == 16 and keys["A"] == 16, keys
    third = await _claim(engine, 16, turns)
    assert Counter(job.concurrency_key for job in third) == {"B": 4, "A": 12}


async def test_within_a_key_and_without_keys_the_order_is_run_at(engine):
    a = await _add(engine, 30, "A", start=_ago(50))
    plain = await _add(engine, 30, None, start=_ago(40))
    turns = KeyTurns()
    taken = [job for _ in range(6) for job in await _claim(engine, 10, turns)]
    assert [job.id for job in taken if job.concurrency_key == "A"] == a
    assert [job.id for job in taken if job.concurrency_key is None] == plain


async def test_the_key_less_jobs_take_their_turn_as_one_more_key(engine):
    await _add(engine, 100, "A", start=_ago(50))
    await _add(engine, 100, None, start=_ago(40))
    got = await _claim(engine, 10, KeyTurns())
    assert Counter(job.concurrency_key for job in got) == {"A": 5, None: 5}


async def test_more_keys_than_slots_take_turns_round_all_of_them(engine):
    """40 keys of 3 jobs each, claims of 16: after every claim, no key has had a job more
    than any other (each gets its first before any its second, and so on)."""
    keys = [f"k{k:02}" for k in range(40)]
    for k, key in enumerate(keys):
        await _add(engine, 3, key, start=_ago(100 - k))
    turns = KeyTurns()
    runs = Counter({key: 0 for key in keys})
    total = 0
    while got := await _claim(engine, 16, turns):
        runs.update(job.concurrency_key for job in got)
        total += len(got)
        assert max(runs.values()) - min(runs.values()) <= 1, runs
    assert total == 120 and set(runs.values()) == {3}


async def test_priority_comes_before_the_turns_of_keys(engine):
    await _add(engine, 20, "A", start=_ago(50))
    urgent = await _add(engine, 3, "B", start=_ago(10), priority=5)
    got = await _claim(engine, 4, KeyTurns())
    assert {job.id for job in got} >= set(urgent)
    assert Counter(job.concurrency_key for job in got) == {"B": 3, "A": 1}


async def test_a_keys_slots_its_share_leaves_go_to_the_keys_with_more(engine):
    """A key with fewer due jobs than its share leaves the rest of the slots to the others;
    so does a key whose jobs are not due yet."""
    await _add(engine, 100, "A", start=_ago(50))
    await _add(engine, 2, "B", start=_ago(40))
    await _add(engine, 5, "later", start=datetime.now(UTC) + timedelta(hours=1))
    got = await _claim(engine, 16, KeyTurns())
    assert Counter(job.concurrency_key for job in got) == {"A": 14, "B": 2}


# The most jobs of one key processing at once.
_MOST_OF_A_KEY = sa.text(
    "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM jobqueue.jobs"
    " WHERE status = 'processing' GROUP BY concurrency_key) AS per_key"
)

Take = Callable[[Any, int, KeyTurns], Awaitable[list]]


async def _race(engine, claimers: int, take: Take) -> tuple[int, list]:
    """`claimers` claimers on their own connections, each taking `take(conn, n, turns)` for
    a random n of slots, then completing a random part of what it holds, until it has
    found nothing 20 times: the most jobs of one key processing at once, sampled after every
    claim, and every job claimed (in claim order)."""
    most = 0
    claimed: list = []

    async def claimer(seed: int) -> None:
        nonlocal most
        rng = random.Random(seed)
        held: list = []
        turns = KeyTurns()
        idle = 0
        async with engine.connect() as conn, engine.connect() as sampler:
            raw = await driver(conn)
            while idle < 20:
                got = await take(raw, rng.randint(1, 6), turns)
                claimed.extend(job.id for job in got)
                held.extend(got)
                most = max(most, int((await sampler.execute(_MOST_OF_A_KEY)).scalar_one()))
                await sampler.commit()
                idle = 0 if got or held else idle + 1
                rng.shuffle(held)
                cut = rng.randint(0, len(held))
                done, held = held[:cut], held[cut:]
                if done:
                    await compiled.record(raw, Operation.COMPLETE, [job.lease for job in done])
                await asyncio.sleep(rng.random() / 200)

    await asyncio.gather(*(claimer(seed) for seed in range(claimers)))
    return most, claimed


async def test_key_concurrency_holds_across_racing_claimers(engine):
    """Eight claimers on their own connections, each completing what it holds at random,
    over 20 keys × 15 jobs with KEY_CONCURRENCY 2: sampled after every claim, no key ever
    has more than 2 jobs processing, and every job runs once."""
    for k in range(20):
        await _add(engine, 15, f"tenant-{k}", start=_ago(60 - k))

    async def take(raw, n: int, turns: KeyTurns) -> list:
        got = await compiled.claim(
            raw, {"default": n}, LEASE, turns=turns.params(["default"]), key_limits={"default": 2}
        )
        turns.learn(got)
        return got

    most, claimed = await _race(engine, 8, take)
    assert most == 2, most  # reached (the test can tell) and never passed
    assert len(claimed) == len(set(claimed)) == 300


async def test_a_key_without_room_leaves_its_slots_to_other_keys(engine):
    await _add(engine, 10, "busy", start=_ago(50))
    await _add(engine, 10, "idle", start=_ago(40))
    turns = KeyTurns()
    limits = {"default": 3}
    first = await _claim(engine, 3, turns, key_limits=limits)
    second = await _claim(engine, 10, turns, key_limits=limits)
    keys = Counter(job.concurrency_key for job in first + second)
    assert keys == {"busy": 3, "idle": 3}, keys
    assert await _claim(engine, 10, turns, key_limits=limits) == []


async def test_keys_without_room_first_in_turn_are_passed_over_for_the_next_ones(engine):
    """A claimer whose turn starts at keys another claimer is taking jobs of right now (their
    locks held by its open transaction, one lock a key it took and no more), then at keys
    at their limit, still fills its slots from the keys after them, one job a key: after
    its first 20 keys it looks at as many again and 16 more, no further."""
    for k in range(80):
        await _add(engine, 3, f"k{k:02}", start=_ago(90 - k))
    limits = {"default": 1}
    async with engine.connect() as holder:
        raw = await driver(holder)
        async with raw.transaction():
            held = await compiled.claim(raw, {"default": 20}, LEASE, key_limits=limits)
            key_locks = await raw.fetchval(
                "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()"
                " AND locktype = 'advisory' AND objsubid = 2"
            )
            # Its transaction still open: keys k00-k19 are locked.
            during = await _claim(engine, 20, KeyTurns(), key_limits=limits)
    after = await _claim(engine, 20, KeyTurns(), key_limits=limits)
    assert [job.concurrency_key for job in held] == [f"k{k:02}" for k in range(20)]
    assert key_locks == 20
    assert [job.concurrency_key for job in during] == [f"k{k:02}" for k in range(20, 40)]
    # k00-k39 are at their limit now: of the 56 keys it looks at, k40-k55 have room.
    assert [job.concurrency_key for job in after] == [f"k{k:02}" for k in range(40, 56)]


async def test_a_handler_that_outlived_its_attempt_still_holds_its_keys_unit(engine):
    """Nothing of key A is processing in the database, but this claimer's handler of one
    of A's jobs still runs (its attempt was recorded as timed out): A has one unit left of
    KEY_CONCURRENCY 2, B both, and the other queue's A its own."""
    await _add(engine, 10, "A", start=_ago(50))
    await _add(engine, 10, "B", start=_ago(40))
    limits = {"default": 2}
    overruns = {("default", "A"): 1, ("other", "A"): 2}
    got = await _claim(engine, 10, KeyTurns(), key_limits=limits, key_overruns=overruns)
    assert Counter(job.concurrency_key for job in got) == {"A": 1, "B": 2}
    # Under a limit of 3, with A's one and B's two claimed above still processing and two
    # overrunning handlers of A: nothing more of A, one more of B.
    more = await _claim(
        engine, 10, KeyTurns(), key_limits={"default": 3}, key_overruns={("default", "A"): 2}
    )
    assert Counter(job.concurrency_key for job in more) == {"B": 1}


async def test_key_concurrency_holds_across_the_priorities_of_one_claim(engine):
    """A key's jobs at three priorities, none running, KEY_CONCURRENCY 2: one claim of many
    slots takes two of them, the higher priorities' first, not two at each priority."""
    for priority in (5, 0, -5):
        await _add(engine, 3, "A", start=_ago(50 - priority), priority=priority)
    await _add(engine, 3, "B", start=_ago(10))
    got = await _claim(engine, 16, KeyTurns(), key_limits={"default": 2})
    a = [job for job in got if job.concurrency_key == "A"]
    assert len(a) == 2 and {job.priority for job in a} == {5}, [(j.priority) for j in a]
    assert Counter(job.concurrency_key for job in got)["B"] == 2


async def _claim_limited(engine, n: int, limits: TypeLimits, **kw) -> list:
    async with engine.connect() as conn:
        raw = await driver(conn)
        return (await compiled.claim_limited(raw, limits, {"default": n}, LEASE, **kw)).jobs


async def test_key_concurrency_holds_for_the_jobs_of_a_limited_type(engine):
    """A type under TYPE_CONCURRENCY is claimed by the limited claim: KEY_CONCURRENCY 2 still
    bounds each key there, counting the key's running jobs of other types and the
    claimer's handlers of the key that outlived their attempts, and a full key's backlog
    is read past rather than holding up the keys behind it."""
    limits = TypeLimits(concurrency={"limited": 10})
    await _add(engine, 2, "A", start=_ago(60))  # type t, claimed below: A is full
    for n, key in enumerate("ABCD"):
        await _add(engine, 10, key, start=_ago(50 - n), type="limited")
    for _ in range(2):
        a = await _claim(engine, 1, KeyTurns(), limited=limits.types)
        assert [(job.type, job.concurrency_key) for job in a] == [("t", "A")]
    keyed = {"key_limits": {"default": 2}, "key_overruns": {("default", "C"): 2}}
    got = await _claim_limited(engine, 16, limits, **keyed)
    assert Counter(job.concurrency_key for job in got) == {"B": 2}, got
    got = await _claim_limited(engine, 16, limits, **keyed)
    assert Counter(job.concurrency_key for job in got) == {"D": 2}, got
    assert await _claim_limited(engine, 16, limits, **keyed) == []
    # Without a key limit, the type's own limit alone holds.
    assert len(await _claim_limited(engine, 16, limits)) == 10 - 4


async def test_key_concurrency_holds_across_limited_and_ordinary_claimers(engine):
    """Jobs of a limited and an unlimited type share 10 keys; six claimers each run the
    limited claim then the ordinary one, as a dispatcher does, completing at random: no key
    ever has more than 2 jobs processing, and every job runs once."""
    for k in range(10):
        await _add(engine, 12, f"tenant-{k}", start=_ago(60 - k), type="limited")
        await _add(engine, 12, f"tenant-{k}", start=_ago(60 - k))
    limits = TypeLimits(concurrency={"limited": 8})
    keys = {"default": 2}

    async def take(raw, n: int, turns: KeyTurns) -> list:
        got = (
            await compiled.claim_limited(raw, limits, {"default": n}, LEASE, key_limits=keys)
        ).jobs
        if len(got) < n:
            more = await compiled.claim(
                raw, {"default": n - len(got)}, LEASE, limited=limits.types,
                turns=turns.params(["default"]), key_limits=keys,
            )  # fmt: skip
            turns.learn(more)
            got += more
        return got

    most, claimed = await _race(engine, 6, take)
    assert most == 2, most
    assert len(claimed) == len(set(claimed)) == 240
