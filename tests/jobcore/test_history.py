"""`jobs_history`, where completed jobs move out of `jobs` (`jobcore.history`): its leaves,
every read of finished jobs finding a job in either table, and retention there (a leaf
dropped whole, the rest row by row, never waiting behind a reader)."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from jobcore import bulk, compiled, control, history, search, store
from jobcore.ids import new_id
from jobcore.rows import Moved, NewJob
from jobcore.schema import jobs
from jobcore.states import Status
from tests.pg import driver, entries_read, move

HOUR = 3600.0
T = datetime(2026, 12, 7, 13, 25, tzinfo=UTC)

# --- leaves -------------------------------------------------------------------------------


def test_a_leaf_is_named_after_its_bounds_and_read_back_from_its_name():
    leaf = history.leaf_at(T, history.HOUR, [])
    assert (leaf.lower, leaf.upper) == (T.replace(minute=0), T.replace(minute=0) + history.HOUR)
    assert leaf.name == "jobs_history_20261207t13_20261207t14"
    assert history.parse(leaf.name) == leaf
    day = history.leaf_at(T, history.DAY, [])
    assert day.name == "jobs_history_20261207t00_20261208t00"
    for foreign in ("jobs_history_x", "jobs_history_20261207t14_20261207t13", "jobs", "other"):
        assert history.parse(foreign) is None


def test_a_leaf_is_hourly_while_retention_keeps_jobs_two_days_at_most():
    assert history.leaf_width(24 * HOUR) == history.leaf_width(1.0) == history.HOUR
    assert history.leaf_width(48 * HOUR) == history.HOUR
    assert history.leaf_width(49 * HOUR) == history.DAY
    assert history.leaf_width(0) == history.DAY  # kept forever


def test_a_new_leaf_never_overlaps_one_made_under_another_width():
    hour = history.leaf_at(T, history.HOUR, [])
    # Daily from then on: the day's leaf starts where the hour's ends, and a moment in the
    # hour's leaf gets that leaf.
    later = history.leaf_at(T + 2 * history.HOUR, history.DAY, [hour])
    assert (later.lower, later.upper) == (hour.upper, T.replace(hour=0, minute=0) + history.DAY)
    assert history.leaf_at(T, history.DAY, [hour, later]) == hour
    before = history.leaf_at(T - 2 * history.HOUR, history.DAY, [hour, later])
    assert (before.lower, before.upper) == (T.replace(hour=0, minute=0), hour.lower)


def test_only_leaves_that_ended_before_the_cutoff_have_expired():
    leaves = [history.leaf_at(T + i * history.HOUR, history.HOUR, []) for i in (2, 0, 1)]
    assert history.expired(leaves, T + 2 * history.HOUR) == sorted(leaves)[:2]
    assert history.expired(leaves, T) == []


# --- a job in either table ------------------------------------------------------------------


async def _submit(engine, *, type_: str = "t", queue: str = "default") -> uuid.UUID:
    async with engine.begin() as conn:
        job, _ = await store.submit(
            conn, NewJob(id=new_id(), type=type_, payload={"n": 1}, max_attempts=3, queue=queue)
        )
    return job.id


async def _complete(engine, job_id: uuid.UUID, finished_ago: float = 0.0) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            sa.update(jobs)
            .where(jobs.c.id == job_id)
            .values(
                status="completed",
                attempts=1,
                result={"ok": True},
                errors=[{"attempt": 1, "error": "boom", "at": "x", "traceback": None}],
                finished_at=sa.func.now() - sa.text(f"interval '{finished_ago} seconds'"),
            )
        )


async def _where(engine, job_id: uuid.UUID) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.text(
                "SELECT 'jobs' FROM jobqueue.jobs WHERE id = :id UNION ALL"
                " SELECT 'history' FROM jobqueue.jobs_history WHERE id = :id"
            ),
            {"id": job_id},
        )
        return [row[0] for row in rows]


async def test_a_moved_job_reads_as_it_did_before_its_move(engine):
    job_id = await _submit(engine)
    await _complete(engine, job_id)
    async with engine.connect() as conn:
        before = await store.get(conn, job_id)
    await move(engine, [job_id])
    assert await _where(engine, job_id) == ["history"]
    async with engine.connect() as conn:
        after = await store.get(conn, job_id)
        assert after == before and after is not None
        assert after.result == {"ok": True} and after.errors and after.status is Status.COMPLETED
        assert await store.get(conn, uuid.uuid4()) is None


async def test_lists_merge_both_tables_newest_first_page_by_page(engine):
    ids = [await _submit(engine, type_="a" if i % 2 else "b", queue=f"q{i % 3}") for i in range(9)]
    for job_id in ids[:6]:
        await _complete(engine, job_id)
    await move(engine, ids[:4:2] + ids[1:4:2][:1])  # some completed jobs moved, some not
    cases = [
        (search.Filters(), ids),
        (search.Filters(statuses={Status.COMPLETED}), ids[:6]),
        (search.Filters(statuses={Status.COMPLETED, Status.PENDING}), ids),
        (search.Filters(statuses={Status.PENDING}), ids[6:]),
        (search.Filters(type="a"), ids[1::2]),
        (search.Filters(queue="q1"), ids[1::3]),
        (search.Filters(statuses={Status.COMPLETED}, type="b", queue="q0"), [ids[0]]),
    ]
    async with engine.connect() as conn:
        for filters, expected in cases:
            seen, before = [], None
            while True:
                page, before = await search.list_jobs(conn, filters, 2, before)
                seen += [job.id for job in page]
                if before is None:
                    break
            assert seen == sorted(expected, reverse=True), filters


async def test_bulk_reads_by_id_find_moved_jobs(engine):
    ids = [await _submit(engine) for _ in range(3)]
    await _complete(engine, ids[0])
    await move(engine, ids[:1])
    async with engine.connect() as conn:
        found = await bulk._get_many(conn, ids)
    assert [job.id for job in found] == sorted(ids, reverse=True)


async def test_a_moved_job_cannot_be_retried_cancelled_or_waited_for(engine):
    job_id = await _submit(engine)
    await _complete(engine, job_id)
    await move(engine, [job_id])
    async with engine.begin() as conn:
        assert await control.manual_retry(conn, job_id) is None
        refused = await control.cancel(conn, job_id)
        assert refused is not None and refused[1] is control.Cancelled.REFUSED
        assert refused[0].status is Status.COMPLETED
        assert not await control.watch(conn, job_id)  # finished: nothing to wait for


async def test_queue_depths_and_the_charts_count_moved_jobs(engine):
    job_id = await _submit(engine, queue="only-history")
    await _complete(engine, job_id)
    await move(engine, [job_id])
    async with engine.connect() as conn:
        depths = {d.queue: d for d in await search.queue_depths(conn)}
        assert depths["only-history"].pending == 0
        minutes = (await conn.execute(search.JOB_COUNT_FINISHED_PER_MINUTE)).all()
        assert sum(row.finished or 0 for row in minutes if row.status == "completed") == 1
        hour = (await conn.execute(search.QUEUE_GET_HOUR)).all()
        assert sum(row.finished for row in hour if row.queue == "only-history") == 1


# --- retention ------------------------------------------------------------------------------


async def _leaves(engine) -> list[history.Leaf]:
    async with engine.connect() as conn:
        return await compiled.history_leaves(await driver(conn))


async def test_retention_drops_an_expired_leaf_whole_and_deletes_in_the_one_the_cutoff_cuts(
    engine,
):
    old = [await _submit(engine) for _ in range(3)]
    cut = [await _submit(engine) for _ in range(2)]
    young = await _submit(engine)
    for job_id in old:
        await _complete(engine, job_id, finished_ago=5 * HOUR)
    await _complete(engine, cut[0], finished_ago=2 * HOUR + 60)
    await _complete(engine, cut[1], finished_ago=2 * HOUR - 60)
    await _complete(engine, young)
    await move(engine, [*old, *cut, young])
    leaves = await _leaves(engine)
    async with engine.connect() as conn:
        d = await driver(conn)
        # Every leaf that ended more than 2 h ago goes, the oldest first, counted.
        dropped = []
        while (n := await compiled.history_drop_expired(d, 2 * HOUR)) is not None:
            dropped.append(n)
        assert sum(dropped) >= 3
        remaining = await compiled.history_leaves(d)
        assert [leaf for leaf in leaves if leaf not in remaining] == history.expired(
            leaves, datetime.now(UTC) - timedelta(hours=2)
        )
        # Row by row in the leaf the cutoff falls in: what finished before it.
        pruned = 0
        while n := await compiled.prune(d, Status.COMPLETED, 2 * HOUR):
            pruned += n
    kept = {job_id for job_id in [*old, *cut, young] if await _where(engine, job_id)}
    assert kept == {cut[1], young}
    assert sum(dropped) + pruned == 4


async def test_a_drop_waits_for_no_reader_and_is_tried_again_later(engine):
    job_id = await _submit(engine)
    await _complete(engine, job_id, finished_ago=3 * HOUR)
    await move(engine, [job_id])
    async with engine.connect() as reader:
        # A report in REPEATABLE READ that read the history holds its lock to the end.
        await reader.execute(sa.text("BEGIN ISOLATION LEVEL REPEATABLE READ"))
        await reader.execute(sa.text("SELECT count(*) FROM jobqueue.jobs_history"))
        async with engine.connect() as conn:
            began = time.monotonic()
            assert await compiled.history_drop_expired(await driver(conn), HOUR) is None
            assert time.monotonic() - began < 2
            # Readers queued behind the drop were not held up past its lock timeout.
            async with engine.connect() as other:
                got = await asyncio.wait_for(store.get(other, job_id), 2)
                assert got is not None
        await reader.execute(sa.text("COMMIT"))
    async with engine.connect() as conn:
        assert await compiled.history_drop_expired(await driver(conn), HOUR) == 1
    assert await _where(engine, job_id) == []


async def test_a_leaf_is_added_once(engine):
    leaf = history.leaf_at(datetime.now(UTC), history.HOUR, [])
    async with engine.connect() as conn:
        d = await driver(conn)
        assert await compiled.history_add_leaf(d, leaf)
        assert not await compiled.history_add_leaf(d, leaf)
        overlapping = history.Leaf(leaf.lower, leaf.lower + history.DAY)
        assert not await compiled.history_add_leaf(d, overlapping)
        assert await compiled.history_leaves(d) == [leaf]


@pytest.mark.parametrize("n", [0, 1])
async def test_nothing_expired_drops_nothing(engine, n):
    for _ in range(n):
        job_id = await _submit(engine)
        await _complete(engine, job_id)
        await move(engine, [job_id])
    async with engine.connect() as conn:
        assert await compiled.history_drop_expired(await driver(conn), HOUR) is None
    assert len(await _leaves(engine)) == n


# --- the move -------------------------------------------------------------------------------


def test_the_move_starts_at_the_oldest_job_within_the_lookback_or_the_retention():
    now = T
    old = now - timedelta(days=30)
    assert history.move_start(old, now, 0) == now - history.MOVE_LOOKBACK
    assert history.move_start(old, now, 24 * HOUR) == now - timedelta(hours=24)
    assert history.move_start(now - timedelta(minutes=5), now, 24 * HOUR) == now - timedelta(
        minutes=5
    )


def test_the_leaves_to_add_cover_from_the_start_to_the_next_leaf_without_a_gap():
    start = T - timedelta(hours=3, minutes=10)
    existing = [history.leaf_at(T - history.HOUR, history.HOUR, [])]
    added = history.leaves_to_add(existing, start, T, history.HOUR)
    leaves = sorted(existing + added)
    assert leaves[0].lower <= start and leaves[-1].lower > T
    assert all(a.upper == b.lower for a, b in itertools.pairwise(leaves))
    assert existing[0] not in added
    assert history.leaves_to_add(leaves, start, T, history.HOUR) == []


async def _move(engine, **options) -> int:
    """How many `_moved` moved."""
    return (await _moved(engine, **options)).jobs


async def _moved(
    engine,
    retention: float = 24 * HOUR,
    batch: int = 5000,
    after: float = 0,
    since: datetime | None = None,
) -> Moved:
    async with engine.connect() as conn:
        return await compiled.history_move(await driver(conn), retention, batch, after, since)


async def _finished_at(engine, job_id: uuid.UUID) -> datetime:
    async with engine.connect() as conn:
        return await conn.scalar(
            sa.text(
                "SELECT finished_at FROM jobqueue.jobs WHERE id = :id"
                " UNION ALL SELECT finished_at FROM jobqueue.jobs_history WHERE id = :id"
            ),
            {"id": job_id},
        )


async def _submit_keyed(engine, key: str) -> uuid.UUID:
    async with engine.begin() as conn:
        job, _ = await store.submit(
            conn, NewJob(id=new_id(), type="t", payload={}, max_attempts=3, idempotency_key=key)
        )
    return job.id


async def test_the_move_takes_completed_jobs_without_a_key_and_nothing_else(engine):
    movable = [await _submit(engine) for _ in range(5)]
    keyed = await _submit_keyed(engine, "k-1")
    pending = await _submit(engine)
    failed = await _submit(engine)
    for job_id in [*movable, keyed]:
        await _complete(engine, job_id)
    async with engine.begin() as conn:
        await conn.execute(
            sa.update(jobs)
            .where(jobs.c.id == failed)
            .values(status="failed", finished_at=sa.func.now())
        )
        before = {job_id: await store.get(conn, job_id) for job_id in movable}
    assert await _move(engine, batch=3) == 3
    assert await _move(engine, batch=3) == 2
    assert await _move(engine, batch=3) == 0
    for job_id in movable:
        assert await _where(engine, job_id) == ["history"]
    for job_id in (keyed, pending, failed):
        assert await _where(engine, job_id) == ["jobs"]
    async with engine.connect() as conn:
        assert {job_id: await store.get(conn, job_id) for job_id in movable} == before
    # Its leaves: the one it needed, and the next hour's.
    leaves = await _leaves(engine)
    assert len(leaves) in (2, 3) and all(a.upper == b.lower for a, b in itertools.pairwise(leaves))


async def test_a_job_older_than_the_retention_stays_for_retention_to_delete(engine):
    old = await _submit(engine)
    await _complete(engine, old, finished_ago=3 * HOUR)
    young = await _submit(engine)
    await _complete(engine, young)
    assert await _move(engine, retention=2 * HOUR) == 1
    assert await _where(engine, old) == ["jobs"] and await _where(engine, young) == ["history"]
    assert await _move(engine, retention=2 * HOUR) == 0  # and it is not read again


async def test_a_job_just_finished_stays_until_it_has_been_finished_a_while(engine):
    job_id = await _submit(engine)
    await _complete(engine, job_id, finished_ago=30)
    assert await _move(engine, after=60) == 0
    assert await _where(engine, job_id) == ["jobs"]
    assert await _move(engine, after=20) == 1


async def test_a_move_says_when_its_newest_job_finished_and_starts_where_it_is_told(engine):
    ids = [await _submit(engine) for _ in range(4)]
    for ago, job_id in zip((40, 30, 20, 10), ids, strict=True):
        await _complete(engine, job_id, finished_ago=ago)
    first = await _moved(engine, batch=2)
    assert first == Moved(2, await _finished_at(engine, ids[1]))
    # From 15 s after it: the job finished 10 s ago, not the one finished 20 s ago.
    later = await _moved(engine, since=first.newest + timedelta(seconds=15))
    assert later == Moved(1, await _finished_at(engine, ids[3]))
    assert await _where(engine, ids[2]) == ["jobs"]
    # From before the newest moved, as the mover reads: the one left, and nothing twice.
    last = await _moved(engine, since=first.newest - timedelta(seconds=5))
    assert last == Moved(1, await _finished_at(engine, ids[2]))
    assert await _moved(engine, since=first.newest + timedelta(seconds=60)) == Moved(0, None)
    assert [await _where(engine, job_id) for job_id in ids] == [["history"]] * 4


async def _movable_entries_read(engine, since: datetime | None) -> int:
    """Entries of `jobs_movable_idx` one move reads, dead ones included, counted for its
    transaction, rolled back."""

    async def moving(raw) -> None:
        assert (await compiled.history_move(raw, 24 * HOUR, 5000, 0, since)).jobs == 10

    return await entries_read(engine, "jobqueue.jobs_movable_idx", moving)


async def test_under_a_held_horizon_a_move_from_the_last_batch_reads_past_what_was_moved(
    engine,
):
    """2,000 jobs are moved while a transaction holds the horizon: their dead entries stay
    at the head of `jobs_movable_idx`. A move from the head reads every one of them; one
    from the margin before the newest job moved reads what lies within it."""
    async with engine.connect() as holder:
        await holder.execute(sa.text("SELECT txid_current()"))  # held until the block ends
        async with engine.begin() as conn:
            # Finished one every 100 ms from half an hour before this hour began: in one
            # leaf with the 10 moved later, whatever the time (a batch reads from the
            # start of its first leaf).
            await conn.execute(
                sa.text(
                    """INSERT INTO jobqueue.jobs (id, type, payload, status, attempts,
                                                  max_attempts, finished_at)
                       SELECT gen_random_uuid(), 't', '{}', 'completed', 1, 3,
                              date_trunc('hour', now()) - interval '30 minutes'
                              + i * interval '100 ms'
                       FROM generate_series(1, 2000) AS i"""
                )
            )
        newest = None
        while (moved := await _moved(engine, batch=250)).jobs:
            newest = moved.newest
        assert newest is not None
        await _complete_later(engine, 10, "date_trunc('hour', now()) - interval '1 minute'")
        swept = await _movable_entries_read(engine, None)
        floored = await _movable_entries_read(engine, newest - history.MOVE_MARGIN)
        await holder.rollback()
    assert swept > 4000, swept  # both reads from the head walk the dead entries
    assert floored < 350, (floored, swept)


async def _complete_later(engine, n: int, at: str) -> None:
    """`n` jobs completed at `at` (SQL)."""
    ids = [await _submit(engine) for _ in range(n)]
    async with engine.begin() as conn:
        await conn.execute(
            sa.update(jobs)
            .where(jobs.c.id.in_(ids))
            .values(status="completed", attempts=1, finished_at=sa.text(at))
        )


async def test_the_move_skips_a_job_another_transaction_holds(engine):
    held, free = await _submit(engine), await _submit(engine)
    for job_id in (held, free):
        await _complete(engine, job_id)
    async with engine.connect() as other:
        await other.execute(sa.text("BEGIN"))
        await other.execute(
            sa.text("SELECT 1 FROM jobqueue.jobs WHERE id = :id FOR UPDATE"), {"id": held}
        )
        assert await asyncio.wait_for(_move(engine), 5) == 1
        await other.execute(sa.text("ROLLBACK"))
    assert await _move(engine) == 1
    assert await _where(engine, held) == ["history"]


async def test_a_move_into_a_leaf_dropped_meanwhile_moves_nothing_and_raises_nothing(
    engine, monkeypatch
):
    job_id = await _submit(engine)
    await _complete(engine, job_id)
    leaves_then = history.leaves_to_add

    def and_drop_them(leaves, start, now, width):
        # The leaves are listed, then retention drops the one the job needs.
        return [] if leaves else leaves_then(leaves, start, now, width)

    assert await _move(engine, batch=1) == 1  # its leaf exists now
    other = await _submit(engine)
    await _complete(engine, other)
    async with engine.begin() as conn:
        for leaf in await compiled.history_leaves(await driver(conn)):
            await conn.execute(sa.text(f"DROP TABLE jobqueue.{leaf.name}"))
    monkeypatch.setattr(history, "leaves_to_add", and_drop_them)
    monkeypatch.setattr(compiled, "history_leaves", _stale(await _leaves_listed(engine)))
    assert await _move(engine) == 0
    assert await _where(engine, other) == ["jobs"]


async def _leaves_listed(engine) -> list[history.Leaf]:
    return [history.leaf_at(datetime.now(UTC), history.HOUR, [])]


def _stale(leaves: list[history.Leaf]):
    async def listed(conn) -> list[history.Leaf]:
        return list(leaves)

    return listed


async def _left(engine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(sa.text("SELECT count(*) FROM jobqueue.jobs")))


async def test_movers_and_readers_racing_find_every_job_once(engine):
    """Two movers at once, in small batches, while readers read records and lists: each
    job is moved once, and every read finds it, in one table or the other."""
    ids = [await _submit(engine) for _ in range(600)]
    async with engine.begin() as conn:
        await conn.execute(
            sa.update(jobs).values(status="completed", attempts=1, finished_at=sa.func.now())
        )
    done = asyncio.Event()
    missing: list[uuid.UUID] = []
    doubled: list[uuid.UUID] = []

    async def mover() -> int:
        # Until nothing is left: a call that could not add a leaf (the other mover was
        # adding it) moves nothing, and the next tries again.
        moved = 0
        deadline = time.monotonic() + 60
        while await _left(engine):
            assert time.monotonic() < deadline, "the movers never finished"
            moved += await _move(engine, batch=25)
        return moved

    async def reader(k: int) -> None:
        async with engine.connect() as conn:
            while not done.is_set():
                for job_id in ids[k::8][:20]:
                    if await store.get(conn, job_id) is None:
                        missing.append(job_id)
                page, _ = await search.list_jobs(conn, search.Filters(), 200, None)
                seen = [job.id for job in page]
                doubled.extend(job_id for job_id in seen if seen.count(job_id) > 1)
                await conn.rollback()

    readers = [asyncio.create_task(reader(k)) for k in range(8)]
    moved = await asyncio.gather(mover(), mover())
    done.set()
    await asyncio.gather(*readers)
    assert sum(moved) == len(ids)
    assert missing == [] and doubled == []
    async with engine.connect() as conn:
        counts = (
            await conn.execute(
                sa.text("SELECT count(*), count(DISTINCT id) FROM jobqueue.jobs_history")
            )
        ).one()
    assert tuple(counts) == (len(ids), len(ids))
