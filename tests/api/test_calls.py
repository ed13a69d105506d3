"""jobqueue_api.calls: the API's hot statements are jobcore.queries' constructs compiled, with
no second copy to drift, and they answer as the store's own calls do."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import asyncpg
import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import queries, runner, store
from jobcore.ids import new_id
from jobcore.rows import NewJob, Submitted
from jobqueue_api import calls, jsonio
from jobqueue_api.database import on_driver, open_engine
from tests.pg import driver


def test_every_statement_the_api_runs_on_asyncpg_is_its_jobcore_construct_compiled():
    dialect = postgresql.asyncpg.dialect()
    sent = {
        calls._SUBMIT: queries.JOB_SUBMIT,
        calls._SUBMIT_AND_NOTIFY: queries.JOB_SUBMIT_NOTIFY,
        calls._SUBMIT_MANY: queries.JOB_SUBMIT_MANY,
        calls._SUBMIT_MANY_KEYLESS: queries.JOB_SUBMIT_MANY_KEYLESS,
        calls._MATCH_REQUESTS: queries.JOB_MATCH_REQUESTS,
        calls._GET: queries.JOB_GET,
        calls._SUBMIT_GROUP: queries.JOB_SUBMIT_GROUP,
        calls._SUBMIT_GROUP_NOTIFY: queries.JOB_SUBMIT_GROUP_NOTIFY,
        calls._NOTIFY: queries.JOB_NOTIFY,
        calls._TYPE_LIST: queries.JOB_TYPE_LIST,
    }
    for compiled, construct in sent.items():
        assert compiled.sql == construct.compile(dialect=dialect).string
        assert compiled is runner.of(construct)  # the one compile cache


def test_a_submit_supplies_every_parameter_its_statements_take():
    new = NewJob(new_id(), "sleep", {"a": 1}, 3)
    for compiled in (calls._SUBMIT, calls._SUBMIT_AND_NOTIFY):
        assert compiled.parameters == set(queries.submit_params(new, "{}"))


@pytest.fixture
async def api_engine(database_url: str):
    engine = open_engine(database_url)
    try:
        yield engine
    finally:
        await engine.dispose()


async def _store_submit(engine: AsyncEngine, new: NewJob, notify: bool = False):
    async with engine.begin() as conn:
        return await store.submit(conn, new, notify=notify)


@pytest.mark.parametrize("notify", [False, True])
async def test_submit_answers_as_store_submit_does(api_engine: AsyncEngine, notify: bool):
    payload = {"big": 2**70, "float": 0.1, "text": "é", "nested": [1, {"b": None}]}
    new = NewJob(new_id(), "sleep", payload, 3, "k", queue="q", priority=2, timeout=1.5)
    job, created = await on_driver(
        api_engine, lambda conn, again: calls.submit(conn, new, notify=notify), retry=False
    )
    assert created and job.id == new.id and job.payload == payload
    # The store's call sees the very same job, and so does the API's read.
    replay = NewJob(new_id(), "sleep", payload, 3, "k", queue="q", priority=2, timeout=1.5)
    assert await _store_submit(api_engine, replay) == (job, False)
    assert (
        await on_driver(api_engine, lambda conn, again: calls.get(conn, new.id), retry=False)
        == dataclasses.replace(job, errors=[])  # the full record: its failed attempts too
    )
    again, created = await on_driver(
        api_engine, lambda conn, again: calls.submit(conn, replay), retry=False
    )
    assert (again, created) == (job, False)
    missing = await on_driver(
        api_engine, lambda conn, again: calls.get(conn, new_id()), retry=False
    )
    assert missing is None


async def test_a_conflicting_submit_raises_as_store_submit_does(api_engine: AsyncEngine):
    await _store_submit(api_engine, NewJob(new_id(), "sleep", {}, 3, "k"))
    other = NewJob(new_id(), "sleep", {"other": True}, 3, "k")
    with pytest.raises(store.IdempotencyConflict):
        await on_driver(api_engine, lambda conn, again: calls.submit(conn, other), retry=False)


def _batch(prefix: str) -> list[NewJob]:
    """Keyless items, a key repeated with the same and with a different request, a key
    that replays a stored job and one that conflicts with it."""

    def job(key: str | None, payload: object, **fields: object) -> NewJob:
        return NewJob(new_id(), "sleep", payload, 3, key and f"{prefix}{key}", **fields)

    return [
        job(None, {"n": 1}),
        job("a", {"n": 2}),
        job("a", {"n": 2}),
        job("a", {"n": 3}),
        job("stored", {"s": 1}),
        job("clash", {"s": 2}),
        job("clash", {"s": 1}),
        job(None, {"n": 4}, queue="other"),
        job("b", [1, 2], priority=3),
    ]


async def _seed(engine: AsyncEngine, prefix: str) -> dict[str, object]:
    stored = {}
    for key in ("stored", "clash"):
        job, _ = await _store_submit(
            engine, NewJob(new_id(), "sleep", {"s": 1}, 3, f"{prefix}{key}")
        )
        stored[key] = job.id
    return stored


def _shape(results: list[Submitted], batch: list[NewJob], stored: dict) -> list:
    """Each result, its id told by what it names: the item's own, a stored job, an
    earlier item's."""
    own = {new.id: i for i, new in enumerate(batch)}
    seeded = {job_id: key for key, job_id in stored.items()}
    shown = []
    for result in results:
        job_id = result.job_id
        named = None if job_id is None else own.get(job_id, seeded.get(job_id, "?"))
        shown.append((result.result, named))
    return shown


async def test_submit_many_answers_item_by_item_as_store_submit_many_does(
    api_engine: AsyncEngine,
):
    stored = await _seed(api_engine, "s-")
    batch = _batch("s-")
    async with api_engine.begin() as conn:
        expected = _shape(await store.submit_many(conn, batch), batch, stored)
    stored = await _seed(api_engine, "c-")
    batch = _batch("c-")
    results = await on_driver(
        api_engine, lambda conn, again: calls.submit_many(conn, batch), retry=False
    )
    assert _shape(results, batch, stored) == expected
    assert [r for r, _ in expected] == [
        "created",
        "created",
        "replayed",
        "conflict",
        "replayed",
        "conflict",
        "replayed",
        "created",
        "created",
    ]


async def test_a_keyless_batch_is_written_whole(api_engine: AsyncEngine):
    batch = [NewJob(new_id(), "sleep", {"n": n}, 3) for n in range(50)]
    results = await on_driver(
        api_engine, lambda conn, again: calls.submit_many(conn, batch), retry=False
    )
    assert results == [Submitted("created", new.id) for new in batch]
    async with api_engine.connect() as conn:
        for new in batch[::7]:
            assert (await store.get(conn, new.id)).payload == new.payload


async def test_payloads_are_written_and_read_as_the_standard_library_would(
    api_engine: AsyncEngine,
):
    payload = {"int": 2**64 + 1, "neg": -(2**63) - 1, "f": 1e-7, "e": 1e16, "s": "\u2028\x7f"}
    new = NewJob(new_id(), "sleep", payload, 3)
    job, _ = await on_driver(api_engine, lambda conn, again: calls.submit(conn, new), retry=False)
    assert job.payload == payload
    async with api_engine.connect() as conn:
        raw = await driver(conn)
        text = await raw.fetchval("SELECT payload::text FROM jobqueue.jobs WHERE id = $1", new.id)
    # The same values, of the same types (jsonb writes 1e16 as an integer: both read an int).
    assert _typed(jsonio.loads(text)) == _typed(json.loads(text)) == _typed(job.payload)


def _typed(value: object) -> str:
    return json.dumps(value, sort_keys=True)


@pytest.mark.parametrize("notify", [False, True])
async def test_a_group_answers_each_job_as_store_get_reads_it_with_at_most_one_notify(
    api_engine: AsyncEngine, database_url: str, notify: bool
):
    news = [
        NewJob(new_id(), "sleep", {"n": 1}, 3),
        NewJob(new_id(), "sleep", [2], 5, queue="other", priority=4, timeout=2.5),
        NewJob(new_id(), "sleep", None, 3, delay=60.0),
    ]
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(database_url.replace("postgresql+asyncpg", "postgresql"))
    await listener.add_listener(queries.NOTIFY_CHANNEL, lambda *args: heard.put_nowait(args[3]))
    try:
        jobs = await on_driver(
            api_engine,
            lambda conn, again: calls.submit_group(conn, news, notify=notify),
            retry=False,
        )
        async with api_engine.connect() as conn:
            # As the full record reads them, less their failed attempts (none).
            full = [await store.get(conn, new.id) for new in news]
            assert [dataclasses.replace(job, errors=[]) for job in jobs] == full
        assert [job.queue for job in jobs] == ["default", "other", "default"]
        assert jobs[2].run_at > jobs[0].run_at
        # Notifications arrive in commit order: all of the group's come before this one.
        async with api_engine.connect() as conn:
            await conn.execute(sa.select(sa.func.pg_notify(queries.NOTIFY_CHANNEL, "end")))
        payloads = []
        while not payloads or payloads[-1] != "end":
            payloads.append(await asyncio.wait_for(heard.get(), 10))
        assert payloads == [""] * notify + ["end"]
    finally:
        await listener.close()
