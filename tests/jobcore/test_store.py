"""Store guarantees under concurrency and crashes (docs/guarantees.md), on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import random

import pytest
import sqlalchemy as sa

from jobcore import compiled, control, queries, store
from jobcore.catalog import recorder_name
from jobcore.errors import IdempotencyConflict
from jobcore.ids import new_id
from jobcore.rows import NewJob, TypeLimits
from jobcore.schema import jobs
from jobcore.states import Operation, Status
from tests.pg import driver

TINY_LEASE = 0.001  # expires before the next statement runs


async def _submit_many(engine, count: int, **fields) -> list:
    async with engine.begin() as conn:
        rows = [
            {"id": new_id(), "type": "sleep", "payload": {"n": i}, "max_attempts": 3, **fields}
            for i in range(count)
        ]
        await conn.execute(sa.insert(jobs), rows)
    return [row["id"] for row in rows]


async def _wait_expired(engine, job_id) -> None:
    """Poll the database clock until the job's lease has run out."""
    for _ in range(200):
        async with engine.connect() as conn:
            expired = await conn.scalar(
                sa.select(jobs.c.locked_until < sa.func.clock_timestamp()).where(
                    jobs.c.id == job_id
                )
            )
        if expired:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("lease never expired")


async def test_concurrent_claimers_never_receive_the_same_job(engine):
    ids = set(await _submit_many(engine, 2000))
    claimed: list = []

    async def claimer(seed: int) -> None:
        rng = random.Random(seed)
        while True:
            async with engine.begin() as conn:
                raw = await driver(conn)
                batch = await compiled.claim(raw, {"default": rng.randint(1, 25)}, 60)
            if not batch:
                return
            claimed.extend(job.id for job in batch)
            await asyncio.sleep(0)

    await asyncio.gather(*(claimer(seed) for seed in range(10)))
    assert len(claimed) == len(ids), "some job was claimed twice or never"
    assert set(claimed) == ids
    async with engine.connect() as conn:
        tokens = (await conn.execute(sa.select(jobs.c.attempts, jobs.c.lease_token))).all()
    assert set(tokens) == {(1, 1)}


async def test_claim_returns_at_most_n_jobs_in_run_at_order_and_skips_future_ones(engine):
    delays = (-1, -3, 3600, -2)
    ids = {delay: new_id() for delay in delays}
    async with engine.begin() as conn:
        rows = [
            {
                "id": ids[delay],
                "type": "sleep",
                "payload": {},
                "max_attempts": 1,
                "run_at": sa.func.now() + sa.text(f"interval '{delay} seconds'"),
            }
            for delay in delays
        ]
        await conn.execute(sa.insert(jobs).values(rows))
    async with engine.begin() as conn:
        raw = await driver(conn)
        first = await compiled.claim(raw, {"default": 2}, 60)
        second = await compiled.claim(raw, {"default": 5}, 60)
    assert {job.id for job in first} == {ids[-3], ids[-2]}
    assert [job.id for job in second] == [ids[-1]]


async def test_stale_worker_cannot_overwrite_newer_claim(engine):
    (job_id,) = await _submit_many(engine, 1)
    async with engine.begin() as conn:
        raw = await driver(conn)
        (old,) = await compiled.claim(raw, {"default": 1}, TINY_LEASE)
    await _wait_expired(engine, job_id)
    async with engine.begin() as conn:
        raw = await driver(conn)
        assert await compiled.recover_expired(raw) == [(job_id, Status.PENDING)]
        (new,) = await compiled.claim(raw, {"default": 1}, 60)
    assert new.lease_token > old.lease_token
    async with engine.begin() as conn:
        raw = await driver(conn)
        assert await compiled.record(raw, Operation.COMPLETE, [old.lease]) == [old.lease]
        assert await compiled.record(raw, Operation.FAIL, [old.lease], ["stale"]) == [old.lease]
        job = await store.get(conn, job_id)
    assert job.status is Status.PROCESSING and job.lease_token == new.lease_token
    async with engine.begin() as conn:
        raw = await driver(conn)
        assert await compiled.record(raw, Operation.COMPLETE, [new.lease]) == []


async def test_stale_worker_cannot_overwrite_newer_claim_after_manual_retry(engine):
    (job_id,) = await _submit_many(engine, 1, max_attempts=1)
    async with engine.begin() as conn:
        raw = await driver(conn)
        (old,) = await compiled.claim(raw, {"default": 1}, TINY_LEASE)
    await _wait_expired(engine, job_id)
    async with engine.begin() as conn:
        raw = await driver(conn)
        assert await compiled.recover_expired(raw) == [(job_id, Status.DEAD_LETTER)]
        assert (await control.manual_retry(conn, job_id)).attempts == 0
        (new,) = await compiled.claim(raw, {"default": 1}, 60)
    # The attempt number repeats after a manual retry; the lease token does not.
    assert new.attempts == old.attempts == 1
    assert new.lease_token > old.lease_token
    async with engine.begin() as conn:
        raw = await driver(conn)
        assert await compiled.record(raw, Operation.DEAD_LETTER, [old.lease], ["stale"]) == [
            old.lease
        ]
        assert await compiled.record(raw, Operation.COMPLETE, [new.lease]) == []


async def test_recovery_returns_expired_leases_to_pending_or_dead_letter_on_the_last_attempt(
    engine,
):
    retry_id, last_id, live_id = (
        (await _submit_many(engine, 1, max_attempts=2))[0],
        (await _submit_many(engine, 1, max_attempts=1))[0],
        (await _submit_many(engine, 1, max_attempts=1))[0],
    )
    async with engine.begin() as conn:
        raw = await driver(conn)
        expiring = await compiled.claim(raw, {"default": 2}, TINY_LEASE)
        await conn.execute(  # push the live job to the back of the queue, then lease it for long
            sa.update(jobs).where(jobs.c.id == live_id).values(run_at=sa.func.now())
        )
    assert {job.id for job in expiring} == {retry_id, last_id}
    async with engine.begin() as conn:
        raw = await driver(conn)
        (live,) = await compiled.claim(raw, {"default": 1}, 60)
    assert live.id == live_id
    for job in expiring:
        await _wait_expired(engine, job.id)
    async with engine.begin() as conn:
        raw = await driver(conn)
        recovered = dict(await compiled.recover_expired(raw))
    assert recovered == {retry_id: Status.PENDING, last_id: Status.DEAD_LETTER}
    async with engine.connect() as conn:
        retry_job = await store.get(conn, retry_id)
        live_job = await store.get(conn, live_id)
    assert retry_job.attempts == 1 and retry_job.locked_until is None
    assert "lease expired" in retry_job.last_error
    assert live_job.status is Status.PROCESSING


async def test_retry_later_schedules_by_the_database_clock(engine):
    await _submit_many(engine, 1)
    async with engine.begin() as conn:
        raw = await driver(conn)
        (job,) = await compiled.claim(raw, {"default": 1}, 60)
        assert (
            await compiled.record(raw, Operation.RETRY_LATER, [job.lease], ["flaky"], [30.0]) == []
        )
        delay = await conn.scalar(
            sa.select(sa.func.extract("epoch", jobs.c.run_at - sa.func.now()))
        )
        assert await compiled.claim(raw, {"default": 1}, 60) == []  # not due yet
    assert 29.9 < float(delay) <= 30.0


async def test_concurrent_duplicate_submissions_create_one_job(engine):
    new = NewJob(new_id(), "sleep", {"b": [1, 2], "a": 1}, 4, "order-42")

    async def submit(i: int):
        async with engine.begin() as conn:
            # Same request each time, with a fresh id and reordered keys (jsonb equality).
            payload = dict(reversed(list(new.payload.items()))) if i % 2 else new.payload
            return await store.submit(
                conn, NewJob(new_id(), "sleep", payload, 4, new.idempotency_key)
            )

    results = await asyncio.gather(*(submit(i) for i in range(40)))
    created = [job for job, was_created in results if was_created]
    assert len(created) == 1
    assert {job.id for job, _ in results} == {created[0].id}
    async with engine.connect() as conn:
        assert await conn.scalar(sa.select(sa.func.count()).select_from(jobs)) == 1


@pytest.mark.parametrize(
    "different",
    [
        {"type": "webhook"},
        {"payload": {"a": 2}},
        {"max_attempts": 5},
        {"concurrency_key": "tenant-7"},
    ],
)
async def test_a_different_request_with_a_used_key_is_a_conflict(engine, different):
    base = {"type": "sleep", "payload": {"a": 1}, "max_attempts": 4}
    async with engine.begin() as conn:
        await store.submit(conn, NewJob(new_id(), idempotency_key="k", **base))
    with pytest.raises(IdempotencyConflict):
        async with engine.begin() as conn:
            await store.submit(conn, NewJob(new_id(), idempotency_key="k", **{**base, **different}))
    async with engine.connect() as conn:
        assert await conn.scalar(sa.select(sa.func.count()).select_from(jobs)) == 1


async def test_submissions_without_a_key_always_create(engine):
    async with engine.begin() as conn:
        for _ in range(3):
            _, created = await store.submit(conn, NewJob(new_id(), "sleep", {}, 1))
            assert created


async def test_submit_with_notify_wakes_listeners_only_when_it_creates(engine, database_url):
    import asyncpg

    from jobcore.db import asyncpg_dsn

    listener = await asyncpg.connect(asyncpg_dsn(database_url))
    heard: list[object] = []
    await listener.add_listener(queries.NOTIFY_CHANNEL, lambda *args: heard.append(args))
    try:
        async with engine.begin() as conn:
            job, created = await store.submit(
                conn, NewJob(new_id(), "sleep", {"x": 1}, 3, "n-1"), notify=True
            )
        assert created and job.payload == {"x": 1}
        for _ in range(500):
            if heard:
                break
            await asyncio.sleep(0.01)
        assert len(heard) == 1
        async with engine.begin() as conn:
            _, created = await store.submit(
                conn, NewJob(new_id(), "sleep", {"x": 1}, 3, "n-1"), notify=True
            )
        assert not created
        await listener.execute("SELECT 1")  # a notification would have arrived by now
        await asyncio.sleep(0.1)
        assert len(heard) == 1
    finally:
        await listener.close()


async def _insert(engine, rows: list[dict]) -> list:
    async with engine.begin() as conn:
        for row in rows:
            row.setdefault("id", new_id())
            await conn.execute(
                sa.insert(jobs).values(type="sleep", payload={}, max_attempts=3, **row)
            )
    return [row["id"] for row in rows]


def _at(seconds: float):
    return sa.func.now() + sa.text(f"interval '{seconds} seconds'")


async def test_a_claim_takes_from_each_queue_at_most_its_slots_in_claim_order(engine):
    a = await _insert(
        engine,
        [
            {"queue": "a", "priority": 0, "run_at": _at(-30)},
            {"queue": "a", "priority": 9, "run_at": _at(-1)},
            {"queue": "a", "priority": 9, "run_at": _at(-2)},
            {"queue": "a", "priority": 50, "run_at": _at(60)},  # not due: never claimed
        ],
    )
    b = await _insert(engine, [{"queue": "b", "run_at": _at(-5)} for _ in range(3)])
    c = await _insert(engine, [{"queue": "c", "run_at": _at(-5)}])
    async with engine.connect() as conn:
        raw = await driver(conn)
        claimed = await compiled.claim(raw, {"a": 2, "b": 5, "x": 1}, 60)
        again = await compiled.claim(raw, {"a": 5}, 60)
    by_queue: dict[str, list] = {}
    for job in claimed:
        by_queue.setdefault(job.queue, []).append(job.id)
    # The first two in claim order (priority 9); the order within one claim is not kept.
    assert sorted(by_queue["a"]) == sorted([a[1], a[2]])
    assert sorted(by_queue["b"]) == sorted(b)
    assert set(by_queue) == {"a", "b"}  # c is not asked for, x has nothing
    assert [job.id for job in again] == [a[0]]
    assert c  # still pending


async def test_next_due_is_when_the_earliest_job_not_yet_due_of_those_queues_is(engine):
    await _insert(
        engine,
        [
            {"queue": "a", "priority": 5, "run_at": _at(40)},
            {"queue": "a", "priority": -5, "run_at": _at(20)},
            {"queue": "a", "run_at": _at(-1)},  # due already: not "next"
            {"queue": "b", "run_at": _at(3)},
        ],
    )
    async with engine.connect() as conn:
        raw = await driver(conn)
        assert 19 < await compiled.next_due(raw, ["a"]) <= 20
        assert 2 < await compiled.next_due(raw, ["a", "b"]) <= 3
        assert await compiled.next_due(raw, ["empty"]) is None


async def test_every_claim_names_the_worker_process_that_holds_the_lease(engine):
    """JOB_CLAIM, JOB_COMPLETE_AND_CLAIM and JOB_CLAIM_LIMITED write `leased_by`; the full
    record reads it, and it stays once the attempt ended (who ran it last)."""
    first, second, third = await _submit_many(engine, 3)
    async with engine.begin() as conn:
        await conn.execute(sa.update(jobs).where(jobs.c.id == third).values(type="report"))
    async with engine.connect() as conn:
        raw = await driver(conn)
        [claimed] = await compiled.claim(raw, {"default": 1}, 60, limited=["report"])
        lost, [refilled] = await compiled.complete_and_claim(
            raw, [claimed.lease], {"default": 1}, 60, limited=["report"]
        )
        limits = TypeLimits(concurrency={"report": 1})
        got = await compiled.claim_limited(raw, limits, {"default": 1}, 60)
        assert not lost and [job.id for job in got.jobs] == [third]
        assert {claimed.id, refilled.id} == {first, second}
        holder = recorder_name()
        for job_id in (first, second, third):
            record = await store.get(conn, job_id)
            assert record is not None and record.leased_by == holder, job_id
        done = await store.get(conn, claimed.id)
        assert done is not None and done.status == Status.COMPLETED
