"""Retention on the real PostgreSQL: finished jobs older than their status's retention are
deleted in batches by the retention leader alone, nothing else is, and an idempotency key is
free again once its job is gone."""

from __future__ import annotations

import asyncio
import logging
import time
from uuid import UUID

import sqlalchemy as sa
from prometheus_client import REGISTRY

from jobcore import compiled, store
from jobcore.ids import new_id
from jobcore.maintenance import PRUNE_BATCH, RETENTION
from jobcore.rows import NewJob
from jobcore.schema import jobs, maintenance_leases
from jobcore.settings import DURATION_LIMITS, load_worker_settings
from jobcore.states import Operation, Status
from jobqueue_worker.database import PgJobStore
from jobqueue_worker.maintenance import Lead, Retention, TakingTurns, retention_ages
from tests.pg import driver, move
from tests.worker.support import eventually

AGE = 1.0  # seconds: the retention the tests use


class Counting:
    """A store that counts prune statements and can run a hook after each."""

    def __init__(self, pg: PgJobStore) -> None:
        self.pg = pg
        self.prunes: list[tuple[Status, int]] = []
        self.drops: list[int] = []  # the jobs of each leaf of the history dropped
        self.began: list[float] = []  # when each prune statement was sent (monotonic)
        self.after_prune = lambda: None

    async def take_lead(self, *args):
        return await self.pg.take_lead(*args)

    async def resign(self, *args):
        return await self.pg.resign(*args)

    async def queue_depths(self, *args):
        return await self.pg.queue_depths(*args)

    async def prune(self, status, age):
        self.began.append(time.monotonic())
        n = await self.pg.prune(status, age)
        self.prunes.append((status, n))
        self.after_prune()
        return n

    async def drop_history(self, age):
        n = await self.pg.drop_history(age)
        if n is not None:
            self.drops.append(n)
        return n


async def insert(engine, status: Status, count: int, queue: str = "default") -> list[UUID]:
    """`count` jobs in `status`, finished now (if finished) by the database's clock."""
    ids = [new_id() for _ in range(count)]
    finished = sa.func.now() if status not in (Status.PENDING, Status.PROCESSING) else None
    async with engine.begin() as conn:
        await conn.execute(
            sa.insert(jobs).from_select(
                ["id", "type", "payload", "status", "max_attempts", "queue", "finished_at"],
                sa.select(
                    sa.func.unnest(sa.bindparam("ids", ids, type_=sa.ARRAY(jobs.c.id.type))),
                    sa.literal("sleep"),
                    sa.text("'{}'::jsonb"),
                    sa.literal(status.value),
                    sa.literal(3),
                    sa.literal(queue),
                    finished,
                ),
            )
        )
    return ids


async def older_than(engine, seconds: float) -> None:
    """Wait until every finished job finished more than `seconds` ago, by the database."""

    async def old() -> bool:
        async with engine.connect() as conn:
            youngest = await conn.scalar(
                sa.select(
                    sa.func.now() - sa.func.max(jobs.c.finished_at)
                    > sa.text(f"interval '{seconds} seconds'")
                )
            )
            return bool(youngest)

    await eventually(old, 10, f"jobs {seconds}s old", interval=0.05)


async def remaining(engine) -> dict[str, set[UUID]]:
    async with engine.connect() as conn:
        rows = await conn.execute(sa.select(jobs.c.status, jobs.c.id))
        found: dict[str, set[UUID]] = {}
        for status, job_id in rows:
            found.setdefault(status, set()).add(job_id)
        return found


def _pruned(status: str) -> float:
    return REGISTRY.get_sample_value("jobs_pruned_total", {"status": status}) or 0.0


async def test_old_finished_jobs_are_pruned_in_batches_and_nothing_younger_or_unfinished(
    engine, pg, caplog
):
    many = 2 * PRUNE_BATCH + 1
    await insert(engine, Status.COMPLETED, many)
    old_failed = await insert(engine, Status.FAILED, 3)
    await older_than(engine, AGE)
    young = await insert(engine, Status.COMPLETED, 50)
    pending = await insert(engine, Status.PENDING, 5)
    counted_before = _pruned("completed")

    counting = Counting(pg)
    # Batches paced quickly: the young jobs must not age past AGE during the run.
    retention = Retention(counting, {Status.COMPLETED: AGE}, batch_interval=0.05)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        assert await retention.run_once() == {Status.COMPLETED: many}
    # Full batches, then one that found fewer: no statement deleted more than a batch.
    assert counting.prunes == [
        (Status.COMPLETED, PRUNE_BATCH),
        (Status.COMPLETED, PRUNE_BATCH),
        (Status.COMPLETED, 1),
    ]
    assert await remaining(engine) == {
        "completed": set(young),
        "failed": set(old_failed),  # no retention given for failed
        "pending": set(pending),
    }
    assert _pruned("completed") == counted_before + many
    (line,) = [r for r in caplog.records if r.getMessage() == "jobs pruned"]
    assert line.pruned == {"completed": many} and line.total == many  # type: ignore[attr-defined]

    # Nothing left to prune: the next run deletes nothing and logs nothing.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        assert await retention.run_once() == {Status.COMPLETED: 0}
    assert not [r for r in caplog.records if r.getMessage() == "jobs pruned"]
    await retention.lead.resign()


async def test_full_batches_start_at_most_once_per_batch_interval(engine, pg):
    await insert(engine, Status.COMPLETED, 2 * PRUNE_BATCH + 1)
    await older_than(engine, AGE)
    counting = Counting(pg)
    retention = Retention(counting, {Status.COMPLETED: AGE}, batch_interval=0.6)  # type: ignore[arg-type]
    assert await retention.run_once() == {Status.COMPLETED: 2 * PRUNE_BATCH + 1}
    assert [n for _, n in counting.prunes] == [PRUNE_BATCH, PRUNE_BATCH, 1]
    gaps = [b - a for a, b in zip(counting.began, counting.began[1:], strict=False)]
    assert min(gaps) >= 0.6, gaps
    await retention.lead.resign()


async def test_each_finished_status_keeps_its_own_retention_and_zero_keeps_forever(engine, pg):
    settings = load_worker_settings(
        {"RETENTION_COMPLETED": "0", "RETENTION_FAILED": "1s", "RETENTION_DEAD_LETTER": "1h"}
    )
    ages = retention_ages(settings)
    assert ages == {
        Status.COMPLETED: 0,
        Status.FAILED: 1,
        Status.CANCELLED: 1,
        Status.DEAD_LETTER: 3600,
    }
    completed = await insert(engine, Status.COMPLETED, 4)
    await insert(engine, Status.FAILED, 3)
    await insert(engine, Status.CANCELLED, 2)
    dead = await insert(engine, Status.DEAD_LETTER, 2)
    await older_than(engine, AGE)

    retention = Retention(TakingTurns(pg), ages)
    assert await retention.run_once() == {
        Status.FAILED: 3,
        Status.CANCELLED: 2,
        Status.DEAD_LETTER: 0,
    }
    assert await remaining(engine) == {"completed": set(completed), "dead_letter": set(dead)}
    await retention.lead.resign()


async def test_only_the_retention_leader_prunes(engine, pg):
    old = await insert(engine, Status.COMPLETED, 3)
    await older_than(engine, AGE)
    other = Lead(pg, RETENTION, 3600)
    assert await other.take()
    retention = Retention(TakingTurns(pg), {Status.COMPLETED: AGE})
    assert await retention.run_once() == {Status.COMPLETED: 0}
    assert await remaining(engine) == {"completed": set(old)}

    await other.resign()
    assert await retention.run_once() == {Status.COMPLETED: 3}
    assert not retention.lead.held or await retention.lead.take()
    await retention.lead.resign()


async def test_a_process_that_keeps_everything_does_not_contend_for_the_lead(engine, pg):
    await insert(engine, Status.COMPLETED, 2)
    await older_than(engine, AGE)
    ages = retention_ages(
        load_worker_settings({"RETENTION_COMPLETED": "0", "RETENTION_FAILED": "0"})
    )
    retention = Retention(TakingTurns(pg), ages)
    assert await retention.run_once() == {}
    async with engine.connect() as conn:
        assert await conn.scalar(sa.select(sa.func.count()).select_from(maintenance_leases)) == 0
    assert len((await remaining(engine))["completed"]) == 2


async def test_an_idempotency_key_is_free_again_once_its_job_is_pruned(engine, pg):
    async with engine.begin() as conn:
        first, created = await store.submit(
            conn, NewJob(new_id(), "sleep", {"duration": "0s"}, 3, idempotency_key="k-1")
        )
    assert created
    async with engine.begin() as conn:
        raw = await driver(conn)
        (claimed,) = await compiled.claim(raw, {"default": 1}, 60)
        assert await compiled.record(raw, Operation.COMPLETE, [claimed.lease]) == []
    # Before pruning, the key still answers with the finished job.
    async with engine.begin() as conn:
        again, created = await store.submit(
            conn, NewJob(new_id(), "sleep", {"duration": "0s"}, 3, idempotency_key="k-1")
        )
    assert not created and again.id == first.id

    await older_than(engine, AGE)
    retention = Retention(TakingTurns(pg), {Status.COMPLETED: AGE})
    assert await retention.run_once() == {Status.COMPLETED: 1}
    async with engine.begin() as conn:
        fresh, created = await store.submit(
            conn, NewJob(new_id(), "sleep", {"duration": "0s"}, 3, idempotency_key="k-1")
        )
    assert created and fresh.id != first.id and fresh.status == Status.PENDING
    await retention.lead.resign()


async def test_a_run_stops_between_batches_when_the_worker_stops_and_resigns(engine, pg):
    await insert(engine, Status.COMPLETED, PRUNE_BATCH + 10)
    await older_than(engine, AGE)
    stop = asyncio.Event()
    counting = Counting(pg)
    counting.after_prune = stop.set  # the worker is told to stop during the first batch
    retention = Retention(counting, {Status.COMPLETED: AGE}, interval=3600)  # type: ignore[arg-type]
    await asyncio.wait_for(retention.run(stop), 10)
    assert counting.prunes == [(Status.COMPLETED, PRUNE_BATCH)]
    assert len((await remaining(engine))["completed"]) == 10
    async with engine.connect() as conn:
        assert await conn.scalar(sa.select(sa.func.count()).select_from(maintenance_leases)) == 0


async def test_a_run_that_loses_its_lead_between_batches_stops_pruning(engine, pg):
    await insert(engine, Status.COMPLETED, PRUNE_BATCH + 10)
    await older_than(engine, AGE)
    counting = Counting(pg)
    retention = Retention(counting, {Status.COMPLETED: AGE}, interval=0.5, lease=1.0)  # type: ignore[arg-type]
    usurper = Lead(pg, RETENTION, 3600)

    async def steal() -> None:
        # The leader's lease is taken over while it pauses after its first batch.
        async with pg.engine.begin() as conn:
            await conn.execute(sa.delete(maintenance_leases))
        assert await usurper.take()

    counting.after_prune = lambda: asyncio.ensure_future(steal())
    assert await retention.run_once() == {Status.COMPLETED: PRUNE_BATCH}
    assert len((await remaining(engine))["completed"]) == 10
    await usurper.resign()


async def test_the_loop_survives_a_database_outage_and_prunes_once_it_answers(engine, pg):
    await insert(engine, Status.COMPLETED, 3)
    await older_than(engine, AGE)

    class Flaky(Counting):
        failures = 2

        async def take_lead(self, *args):
            if self.failures:
                self.failures -= 1
                raise ConnectionError("refused")
            return await self.pg.take_lead(*args)

    flaky = Flaky(pg)
    stop = asyncio.Event()
    retention = Retention(flaky, {Status.COMPLETED: AGE}, interval=3600)  # type: ignore[arg-type]
    loop = asyncio.create_task(retention.run(stop))
    try:
        await eventually(lambda: _none_left(engine), 10, "the retried run")
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)
    assert flaky.failures == 0


async def _none_left(engine) -> bool:
    return not await remaining(engine)


async def test_the_longest_retention_is_a_valid_prune(pg):
    await pg.prune(Status.COMPLETED, DURATION_LIMITS["retention_completed"])


async def test_an_expired_leaf_of_the_history_is_dropped_whole_and_counted(engine, pg):
    moved = await insert(engine, Status.COMPLETED, 20)
    kept = await insert(engine, Status.COMPLETED, 3)
    async with engine.begin() as conn:
        await conn.execute(
            sa.update(jobs)
            .where(jobs.c.id.in_(moved))
            .values(finished_at=sa.func.now() - sa.text("interval '5 hours'"))
        )
    await move(engine, moved + kept)
    counted_before = _pruned("completed")
    counting = Counting(pg)
    retention = Retention(counting, {Status.COMPLETED: 3600.0})  # type: ignore[arg-type]
    assert await retention.run_once() == {Status.COMPLETED: 20}
    # The leaf, dropped (and counted) whole, then nothing left to delete row by row.
    assert counting.drops == [20] and counting.prunes == [(Status.COMPLETED, 0)]
    assert _pruned("completed") == counted_before + 20
    async with engine.connect() as conn:
        d = await driver(conn)
        assert len(await compiled.history_leaves(d)) == 1
        left = await d.fetch("SELECT id FROM jobqueue.jobs_history")
    assert {row["id"] for row in left} == set(kept)
    await retention.lead.resign()


async def test_expired_leaves_are_dropped_one_after_another_without_a_pause(engine, pg):
    """A DROP writes no row: unlike a batch of deletes, it leaves the queue's work alone."""
    ids = await insert(engine, Status.COMPLETED, 30)
    async with engine.begin() as conn:
        for hours, chunk in ((5, ids[:10]), (7, ids[10:20]), (9, ids[20:])):
            await conn.execute(
                sa.update(jobs)
                .where(jobs.c.id.in_(chunk))
                .values(finished_at=sa.func.now() - sa.text(f"interval '{hours} hours'"))
            )
    await move(engine, ids)
    counting = Counting(pg)
    # A second between full batches: three paced steps would take seconds.
    retention = Retention(counting, {Status.COMPLETED: 3600.0}, batch_interval=1.0)  # type: ignore[arg-type]
    began = time.monotonic()
    assert await retention.run_once() == {Status.COMPLETED: 30}
    assert counting.drops == [10, 10, 10]
    assert time.monotonic() - began < 1.0
    await retention.lead.resign()
