"""Moving completed jobs to `jobs_history` on the real PostgreSQL: the leader of the task
alone moves them, batch after batch until none are left, and counts them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from jobcore import compiled
from jobcore.floors import Sweeps
from jobcore.history import MOVE_MARGIN
from jobcore.maintenance import HISTORY
from jobcore.rows import Moved
from jobcore.schema import jobs
from jobcore.states import Status
from jobqueue_worker.history import History
from jobqueue_worker.maintenance import Lead, TakingTurns
from tests.pg import driver
from tests.worker.support import eventually
from tests.worker.test_retention import insert, remaining

DAY = 86400.0


def _moved() -> float:
    return REGISTRY.get_sample_value("jobs_moved_total") or 0.0


async def _history(engine) -> set:
    async with engine.connect() as conn:
        rows = await (await driver(conn)).fetch("SELECT id FROM jobqueue.jobs_history")
    return {row["id"] for row in rows}


class Counting:
    """The worker's store, counting the move statements."""

    def __init__(self, pg) -> None:
        self.pg = pg
        self.moves: list[int] = []
        self.since: list[datetime | None] = []

    async def take_lead(self, *args):
        return await self.pg.take_lead(*args)

    async def resign(self, *args):
        return await self.pg.resign(*args)

    async def move_history(
        self, retention: float, batch: int, after: float, since: datetime | None
    ) -> Moved:
        moved = await self.pg.move_history(retention, batch, after, since)
        self.moves.append(moved.jobs)
        self.since.append(since)
        return moved


async def test_the_leader_moves_completed_jobs_batch_after_batch_and_counts_them(engine, pg):
    completed = await insert(engine, Status.COMPLETED, 5)
    failed = await insert(engine, Status.FAILED, 2)
    pending = await insert(engine, Status.PENDING, 2)
    counted = _moved()
    counting = Counting(pg)
    history = History(counting, DAY, batch=2, after=0)  # type: ignore[arg-type]
    assert await history.run_once() == 5
    assert counting.moves == [2, 2, 1]
    assert _moved() == counted + 5
    assert await _history(engine) == set(completed)
    assert await remaining(engine) == {"failed": set(failed), "pending": set(pending)}
    assert await history.run_once() == 0  # nothing left
    await history.lead.resign()


async def test_only_the_leader_moves(engine, pg):
    completed = await insert(engine, Status.COMPLETED, 3)
    other = Lead(pg, HISTORY, 3600)
    assert await other.take()
    history = History(TakingTurns(pg), DAY, after=0)
    assert await history.run_once() == 0
    assert await _history(engine) == set()
    await other.resign()
    assert await history.run_once() == 3
    assert await _history(engine) == set(completed)
    await history.lead.resign()


async def test_the_loop_moves_jobs_as_they_complete_until_it_stops(engine, pg):
    history = History(TakingTurns(pg), DAY, interval=0.05, after=0)
    stop = asyncio.Event()
    loop = asyncio.create_task(history.run(stop))
    try:
        for _ in range(3):
            batch = await insert(engine, Status.COMPLETED, 10)

            async def moved(batch: list = batch) -> bool:
                return set(batch) <= await _history(engine)

            await eventually(moved, 10, "the batch moved", interval=0.02)
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)
    assert not history.lead.held  # it resigned
    async with engine.connect() as conn:
        assert len(await compiled.history_leaves(await driver(conn))) >= 2


async def test_a_job_moves_once_it_has_been_finished_a_while(engine, pg):
    """The jobs just finished stay where their readers look first."""
    young = await insert(engine, Status.COMPLETED, 2)
    history = History(TakingTurns(pg), DAY, after=3600)
    assert await history.run_once() == 0
    assert await remaining(engine) == {"completed": set(young)}
    await history.lead.resign()


async def test_the_leader_reads_from_its_last_batch_and_finds_a_late_job_at_its_next_sweep(
    engine, pg
):
    """After a read from the head, the moves start a margin before the newest job moved
    (under a held horizon the head is every job moved since); a job that turns up below
    that, as one whose transaction committed late does, moves at the next sweep."""
    await insert(engine, Status.COMPLETED, 5)
    counting = Counting(pg)
    history = History(counting, DAY, batch=2, after=0)  # type: ignore[arg-type]
    history.sweeps = Sweeps(ratio=1e9, max_interval=3600, cheap=float("inf"))  # one sweep
    assert await history.run_once() == 5
    newest = history.newest
    assert newest is not None
    assert counting.since[0] is None
    assert all(since is not None for since in counting.since[1:])
    late = await insert(engine, Status.COMPLETED, 1)
    await _finished(engine, late, newest - 2 * MOVE_MARGIN)
    assert await history.run_once() == 0
    assert counting.since[-1] == newest - MOVE_MARGIN
    history.sweeps = Sweeps()  # due at once
    assert await history.run_once() == 1
    assert counting.since[-1] is None
    assert set(late) <= await _history(engine)
    await history.lead.resign()


async def _finished(engine, ids: list, at: datetime) -> None:
    async with engine.begin() as conn:
        await conn.execute(sa.update(jobs).where(jobs.c.id.in_(ids)).values(finished_at=at))


async def test_a_sweep_that_moves_a_full_batch_takes_the_reads_after_it_back_to_its_backlog(
    engine, pg
):
    """Jobs that turn up far below where the moves got (a clock stepped back, many late
    commits): the sweep that finds them full leads the next batches to the rest of them."""
    counting = Counting(pg)
    history = History(counting, DAY, batch=2, after=0)  # type: ignore[arg-type]
    await insert(engine, Status.COMPLETED, 1)
    assert await history.run_once() == 1
    newest = history.newest
    assert newest is not None
    # The next round sweeps, and only its first batch.
    history.sweeps = Sweeps(ratio=1e9, max_interval=3600, cheap=float("inf"))
    backlog = await insert(engine, Status.COMPLETED, 5)
    await _finished(engine, backlog, newest - 10 * MOVE_MARGIN)
    assert await history.run_once() == 5
    # The sweep, then the rest of the backlog from where the sweep got.
    assert counting.since[-3:] == [None, *[newest - 11 * MOVE_MARGIN] * 2]
    await history.lead.resign()


class SweepsTimingOut(Counting):
    """The real store, but every read from the head runs out of time, as one does under a
    horizon held for hours."""

    async def move_history(
        self, retention: float, batch: int, after: float, since: datetime | None
    ) -> Moved:
        if since is None:
            self.since.append(since)
            raise TimeoutError("canceling statement due to statement timeout")
        return await super().move_history(retention, batch, after, since)


async def test_a_leader_whose_sweeps_time_out_still_moves_the_jobs_finishing_now(engine, pg):
    """Its first read from the head fails: it moves the jobs that finish from then on, and
    the older ones at the first sweep that succeeds."""
    old = await insert(engine, Status.COMPLETED, 2)
    await _finished(engine, old, datetime.now(UTC) - timedelta(hours=1))
    timing_out = SweepsTimingOut(pg)
    history = History(timing_out, DAY, after=0)  # type: ignore[arg-type]
    history.sweeps = Sweeps(ratio=1e9, max_interval=3600, cheap=float("inf"))
    with pytest.raises(TimeoutError):
        await history.run_once()
    assert timing_out.since == [None]
    new = await insert(engine, Status.COMPLETED, 3)
    assert await history.run_once() == 3
    assert timing_out.since[-1] is not None
    assert await _history(engine) == set(new)
    history.store = Counting(pg)  # type: ignore[assignment]
    history.sweeps = Sweeps()
    assert await history.run_once() == 2
    assert await _history(engine) == set(new) | set(old)
    await history.lead.resign()
