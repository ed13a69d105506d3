"""Moving completed jobs to `jobs_history` on the real PostgreSQL: the leader of the task
alone moves them, batch after batch until none are left, and counts them."""

from __future__ import annotations

import asyncio
from datetime import datetime

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
    async with engine.begin() as conn:
        await conn.execute(
            sa.update(jobs).where(jobs.c.id == late[0]).values(finished_at=newest - 2 * MOVE_MARGIN)
        )
    assert await history.run_once() == 0
    assert counting.since[-1] == newest - MOVE_MARGIN
    history.sweeps = Sweeps()  # due at once
    assert await history.run_once() == 1
    assert counting.since[-1] is None
    assert set(late) <= await _history(engine)
    await history.lead.resign()
