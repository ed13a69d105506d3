"""Pausing queues (`jobcore.pauses`) and the bulk actions (`jobcore.bulk`) against a real
PostgreSQL: idempotent pauses announced to listeners, filters validated field by field, and
bulk actions that change exactly the matching jobs that allow them, at most `limit`, each
once, also while other sessions claim them."""

from __future__ import annotations

import asyncio
import itertools
import uuid

import asyncpg
import pytest
import sqlalchemy as sa

from jobcore import bulk, pauses
from jobcore.bulk import Selection, selection_from_json
from jobcore.db import connect_args, make_engine
from jobcore.errors import InvalidRequest, SchemaNotAtHead
from jobcore.schema import jobs
from jobcore.states import Status
from tests.jobcore.test_search import _insert
from tests.jobcore.test_states import C, D, F, P, R, X


@pytest.fixture
async def auto(database_url):
    """An engine whose connections commit each statement, as the API's."""
    engine = make_engine(database_url, pool_size=4, isolation_level="AUTOCOMMIT")
    try:
        yield engine
    finally:
        await engine.dispose()


async def test_pause_is_idempotent_keeps_its_first_time_and_is_announced(auto, database_url):
    listener = await asyncpg.connect(**connect_args(database_url))
    heard: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener(pauses.PAUSE_CHANNEL, lambda *a: heard.put_nowait(a[3]))
    try:
        async with auto.connect() as conn:
            first = await pauses.pause(conn, "never-used")
            again = await pauses.pause(conn, "never-used")
            assert first == again and first.queue == "never-used"
            assert await pauses.is_paused(conn, "never-used")
            assert not await pauses.is_paused(conn, "other")
            assert [p.queue for p in await pauses.paused_queues(conn)] == ["never-used"]
            assert await pauses.resume(conn, "never-used") is True
            assert await pauses.resume(conn, "never-used") is False
            assert await pauses.paused_queues(conn) == []
        got = [await asyncio.wait_for(heard.get(), 5) for _ in range(3)]
        assert got == ["never-used"] * 3  # two pauses and the one resume that resumed
    finally:
        await listener.close()


@pytest.mark.parametrize("name", ["", "Upper", "-x", "a" * 64, "a b", "é"])
async def test_a_name_no_queue_can_have_is_refused_and_nothing_is_written(auto, name):
    async with auto.connect() as conn:
        with pytest.raises(InvalidRequest):
            await pauses.pause(conn, name)
        with pytest.raises(InvalidRequest):
            await pauses.resume(conn, name)
        assert await pauses.paused_queues(conn) == []


@pytest.mark.parametrize(
    "body",
    [
        [],
        {},
        {"limit": 5},
        {"status": "pending", "bogus": 1},
        {"status": "nope"},
        {"status": []},
        {"status": [1]},
        {"type": ""},
        {"type": 3},
        {"queue": "Bad"},
        {"ids": ["not-a-uuid"]},
        {"ids": "x"},
        {"ids": [str(uuid.uuid4()) for _ in range(1001)]},
        {"queue": "q", "limit": 0},
        {"queue": "q", "limit": 10_001},
        {"queue": "q", "limit": True},
        {"queue": "q", "limit": 1.5},
        {"queue": "q", "limit": "5"},
    ],
)
def test_malformed_filters_are_refused(body):
    with pytest.raises(InvalidRequest):
        selection_from_json(body)


def test_filters_parse_like_the_list():
    one = str(uuid.uuid4())
    got = selection_from_json({"status": "pending,dead_letter", "queue": "q", "ids": [one]})
    assert got == Selection(
        statuses=frozenset({P, D}), queue="q", ids=(uuid.UUID(one),), limit=1000
    )
    assert selection_from_json({"status": ["failed"], "limit": 10_000}).limit == 10_000
    assert selection_from_json({"type": "t", "queue": None}).queue is None


async def _statuses(engine, ids) -> dict:
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.select(jobs.c.id, jobs.c.status, jobs.c.cancel_requested_at).where(
                jobs.c.id.in_(ids)
            )
        )
        return {row.id: (Status(row.status), row.cancel_requested_at) for row in rows}


async def test_bulk_cancel_changes_exactly_the_matching_cancellable_jobs(auto):
    rows = await _insert(auto, list(itertools.product(Status, ("a", "b"), ("q1", "q2"))) * 3)
    async with auto.connect() as conn:
        got = await bulk.cancel_matching(conn, Selection(type="a", queue="q1"))
    want = [r for r in rows if r.type == "a" and r.queue == "q1"]
    assert got.cancelled == sum(r.status in (P, D) for r in want)
    assert got.cancel_requested == sum(r.status is R for r in want)

    after = await _statuses(auto, [r.id for r in rows])
    for r in rows:
        status, requested = after[r.id]
        if r in want and r.status in (P, D):
            assert status is X
        elif r in want and r.status is R:
            assert status is R and requested is not None
        else:
            assert status is r.status and requested is None
    # Asked already: not asked, nor counted, again.
    async with auto.connect() as conn:
        again = await bulk.cancel_matching(conn, Selection(type="a", queue="q1"))
    assert (again.cancelled, again.cancel_requested, again.more) == (0, 0, False)


async def test_bulk_retry_respects_the_limit_and_says_more(auto):
    rows = await _insert(auto, [(F, "a", "q")] * 7 + [(C, "a", "q")] * 3 + [(D, "b", "q")] * 2)
    async with auto.connect() as conn:
        first = await bulk.retry_matching(conn, Selection(queue="q", limit=5))
        second = await bulk.retry_matching(conn, Selection(queue="q", limit=5))
        third = await bulk.retry_matching(conn, Selection(queue="q", limit=5))
    assert (first.retried, first.more) == (5, True)
    assert (second.retried, second.more) == (4, False)
    assert (third.retried, third.more) == (0, False)
    after = await _statuses(auto, [r.id for r in rows])
    assert sum(status is P for status, _ in after.values()) == 9
    assert sum(status is C for status, _ in after.values()) == 3


async def test_bulk_by_ids_ignores_unknown_ones_and_applies_the_other_filters(auto):
    rows = await _insert(auto, [(D, "a", "q"), (D, "b", "q"), (C, "a", "q")])
    ids = [str(r.id) for r in rows] + [str(uuid.uuid4())]
    async with auto.connect() as conn:
        got = await bulk.cancel_matching(conn, selection_from_json({"ids": ids, "type": "a"}))
    assert (got.cancelled, got.cancel_requested, got.more) == (1, 0, False)
    after = await _statuses(auto, [r.id for r in rows])
    assert [after[r.id][0] for r in rows] == [X, D, C]


async def test_bulk_cancel_while_jobs_are_claimed_changes_each_job_exactly_once(auto):
    """Claimers take pending jobs (and finish some) while a bulk cancel runs over them:
    every job ends up either cancelled (at once or by request), or finished by its
    claimer, and the counts add up to the jobs the cancel changed."""
    n = 3000
    await _insert(auto, [(P, "t", "race")] * n)
    c = jobs.c
    claim = sa.text(
        """
        UPDATE jobqueue.jobs SET status = 'processing', attempts = attempts + 1,
               locked_until = now() + interval '5 minutes', lease_token = lease_token + 1
        WHERE id IN (SELECT id FROM jobqueue.jobs WHERE status = 'pending' AND queue = 'race'
                     ORDER BY id LIMIT 20 FOR UPDATE SKIP LOCKED)
        RETURNING id"""
    )
    finish = sa.text(
        """
        UPDATE jobqueue.jobs SET status = 'completed', locked_until = NULL, finished_at = now()
        WHERE id = ANY(:ids) AND status = 'processing' AND cancel_requested_at IS NULL
        RETURNING id"""
    )
    stop = asyncio.Event()
    completed: set = set()

    async def claimer() -> None:
        async with auto.connect() as conn:
            while not stop.is_set():
                got = [row.id for row in await conn.execute(claim)]
                if not got:
                    await asyncio.sleep(0.001)
                    continue
                done = await conn.execute(finish, {"ids": got[::2]})
                completed.update(row.id for row in done)

    claimers = [asyncio.create_task(claimer()) for _ in range(3)]
    await asyncio.sleep(0.05)
    async with auto.connect() as conn:
        got = await bulk.cancel_matching(conn, Selection(queue="race", limit=10_000))
    stop.set()
    await asyncio.gather(*claimers)
    async with auto.connect() as conn:
        rows = (await conn.execute(sa.select(c.id, c.status, c.cancel_requested_at))).all()
    assert len(rows) == n
    cancelled = {r.id for r in rows if r.status == X.value}
    requested = {r.id for r in rows if r.status == R.value and r.cancel_requested_at is not None}
    finished = {r.id for r in rows if r.status == C.value}
    running = {r.id for r in rows if r.status == R.value and r.cancel_requested_at is None}
    assert finished == completed
    assert finished and (requested or running), "the claimers never raced the cancel"
    assert not cancelled & finished
    assert got.cancelled == len(cancelled)
    assert got.cancel_requested == len(requested)
    # A job claimed and left running unasked was claimed after the cancel passed it by: it
    # was pending when read, then neither statement could change it within the tries.
    assert not {r.id for r in rows if r.status == P.value}, "a pending job was left"
    assert len(cancelled) + len(requested) + len(finished) + len(running) == n


async def test_before_0010_nothing_is_paused_and_a_pause_asks_for_the_migration(database_url):
    """The services also run on 0008 and 0009 (while `jobqueue migrate` defers 0009): the
    queues read as unpaused, a resume changes nothing, a pause names the migration."""
    from jobcore import migrate

    await asyncio.to_thread(migrate.downgrade, "0009", database_url)
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            # The queue depths read `jobs_history` (0014) too: here only `queue_pauses` is
            # missing.
            await conn.execute(
                sa.text(
                    "CREATE TABLE jobqueue.jobs_history (LIKE jobqueue.jobs)"
                    " PARTITION BY RANGE (finished_at)"
                )
            )
            assert await pauses.paused_queues(conn) == []
            assert await pauses.queues_with_pauses(conn) == []
            assert await pauses.resume(conn, "mail") is False
            with pytest.raises(SchemaNotAtHead, match="jobqueue migrate"):
                await pauses.pause(conn, "mail")
            # The connection is still usable.
            assert await pauses.is_paused(conn, "mail") is False
    finally:
        await engine.dispose()


def _stale_pages(monkeypatch, page):
    """The jobs as a page read them, before another transaction changed them."""

    async def pages(conn, selection, allowed):
        yield page

    monkeypatch.setattr(bulk, "_pages", pages)


async def test_a_job_that_left_the_filter_after_the_read_is_not_changed(auto, monkeypatch):
    [job] = await _insert(auto, [(P, "a", "q")])
    async with auto.connect() as conn:
        page = await bulk._get_many(conn, [job.id])
        await conn.execute(
            sa.update(jobs).values(
                status=R.value,
                attempts=1,
                locked_until=sa.func.now() + sa.text("interval '1 minute'"),
            )
        )
        await conn.commit()
        _stale_pages(monkeypatch, page)
        done = await bulk.cancel_matching(conn, Selection(statuses=frozenset({P})))
        row = (await conn.execute(sa.select(jobs.c.cancel_requested_at))).one()
    # Claimed since it was read as pending: not asked to stop, `processing` was not selected.
    assert (done.cancelled, done.cancel_requested, row.cancel_requested_at) == (0, 0, None)


async def test_a_job_that_went_away_does_not_count_against_the_limit(auto, monkeypatch):
    first, second = await _insert(auto, [(P, "a", "q"), (P, "a", "q")])
    async with auto.connect() as conn:
        page = await bulk._get_many(conn, [first.id, second.id])
        page.sort(key=lambda job: job.id != first.id)
        await conn.execute(sa.update(jobs).where(jobs.c.id == first.id).values(status=X.value))
        await conn.commit()
        _stale_pages(monkeypatch, page)
        done = await bulk.cancel_matching(conn, Selection(queue="q", limit=1))
        statuses = dict((await conn.execute(sa.select(jobs.c.id, jobs.c.status))).all())
    assert (done.cancelled, done.more) == (1, False)
    assert statuses == {first.id: X.value, second.id: X.value}
