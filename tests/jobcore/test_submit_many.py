"""Bulk submit: one statement, per-item results in input order, idempotency as for one job."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa

from jobcore import store
from jobcore.ids import new_id
from jobcore.rows import NewJob, Submitted
from jobcore.schema import jobs


def _new(payload=None, key=None, job_type="sleep", max_attempts=3) -> NewJob:
    return NewJob(new_id(), job_type, {} if payload is None else payload, max_attempts, key)


async def _count(engine) -> int:
    async with engine.connect() as conn:
        return await conn.scalar(sa.select(sa.func.count()).select_from(jobs))


async def test_bulk_submit_creates_every_job_and_reports_in_input_order(engine):
    batch = [_new({"i": i}) for i in range(1000)]
    async with engine.begin() as conn:
        results = await store.submit_many(conn, batch)
    assert results == [Submitted("created", new.id) for new in batch]
    async with engine.connect() as conn:
        payloads = {row.id: row.payload for row in await conn.execute(sa.select(jobs))}
    assert payloads == {new.id: new.payload for new in batch}


async def test_bulk_submit_replays_and_conflicts_with_existing_keys(engine):
    async with engine.begin() as conn:
        existing, _ = await store.submit(conn, _new({"a": 1, "b": 2}, key="k1"))
    batch = [_new({"b": 2, "a": 1}, key="k1"), _new({"a": 9}, key="k1x"), _new({"a": 3}, key="k2")]
    conflicting = _new({"a": 1}, key="k1", max_attempts=4)
    async with engine.begin() as conn:
        await store.submit(conn, _new({"other": True}, key="k1x"))
        results = await store.submit_many(conn, [*batch, conflicting])
    assert results == [
        Submitted("replayed", existing.id),
        Submitted("conflict", None),
        Submitted("created", batch[2].id),
        Submitted("conflict", None),
    ]
    assert await _count(engine) == 3


async def test_a_key_repeated_inside_a_batch_acts_like_sequential_submissions(engine):
    first = _new({"x": 1}, key="dup")
    same = _new({"x": 1}, key="dup")
    different = _new({"x": True}, key="dup")  # true is not 1 in jsonb
    async with engine.begin() as conn:
        results = await store.submit_many(conn, [first, same, different])
    assert results == [
        Submitted("created", first.id),
        Submitted("replayed", first.id),
        Submitted("conflict", None),
    ]
    assert await _count(engine) == 1


async def test_a_repeated_key_compares_every_item_with_the_stored_job(engine):
    async with engine.begin() as conn:
        stored, _ = await store.submit(conn, _new({"x": 1}, key="dup"))
    differs = _new({"x": 2}, key="dup")
    matches = _new({"x": 1}, key="dup")
    async with engine.begin() as conn:
        results = await store.submit_many(conn, [differs, matches, differs])
    # Sent one after another: conflict, replay, conflict.
    assert results == [
        Submitted("conflict", None),
        Submitted("replayed", stored.id),
        Submitted("conflict", None),
    ]
    assert await _count(engine) == 1


async def test_concurrent_bulk_submissions_with_shared_keys_create_each_job_once(engine):
    keys = [f"key-{i}" for i in range(200)]

    async def submit_all(offset: int):
        batch = [_new({"k": k}, key=k) for k in keys[offset:] + keys[:offset]]
        async with engine.begin() as conn:
            return await store.submit_many(conn, batch)

    outcomes = await asyncio.gather(*(submit_all(i * 37 % 200) for i in range(8)))
    created = [r for results in outcomes for r in results if r.result == "created"]
    replayed = [r for results in outcomes for r in results if r.result == "replayed"]
    assert len(created) == 200 and len(replayed) == 7 * 200
    assert {r.job_id for r in created} == {r.job_id for r in replayed}
    assert await _count(engine) == 200


async def test_an_empty_batch_writes_nothing_and_answers_no_results(engine):
    async with engine.begin() as conn:
        assert await store.submit_many(conn, []) == []
    assert await _count(engine) == 0
