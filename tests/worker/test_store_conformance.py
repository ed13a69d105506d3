"""One suite, two stores: the in-memory `FakeStore` the unit tests use and `PgJobStore` on the
real PostgreSQL answer every call a worker process makes (`JobStore`, `MaintenanceStore`)
alike: claim order and slots, every outcome's declared effects and its fence, renewals (a
locked row is busy, not lost), recovery, the combined complete-and-claim, per-type limits,
the next due job, and the maintenance calls. Whatever the fake gets wrong here, the unit
tests built on it would believe."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import store
from jobcore.ids import new_id
from jobcore.rows import Lease, NewJob, TypeLimits
from jobcore.schema import jobs
from jobcore.states import ATTEMPT_OUTCOMES, FINISHED, Operation, Status, unhandled_delay
from jobqueue_worker.database import PgJobStore
from tests.worker.fakestore import FakeStore

LEASE = 60.0
LIMITS = TypeLimits(concurrency={"limited": 2})


class Memory:
    """The fake, and how a test sets up and reads its jobs."""

    def __init__(self) -> None:
        self.store = FakeStore(limits=LIMITS)

    async def add(
        self, type: str = "t", *, delay: float = 0.0, created_ago: float = 0.0, **fields: Any
    ) -> UUID:
        now = self.store.clock()
        return self.store.add(
            type, run_at=now + delay - 0.001, created_at=now - created_ago, **fields
        )

    async def job(self, job_id: UUID) -> dict[str, Any] | None:
        job = self.store.jobs.get(job_id)
        if job is None:
            return None
        return {
            "status": job.status,
            "attempts": job.attempts,
            "last_error": job.last_error,
            "errors": _entries(job.errors),
            "concurrency_key": job.concurrency_key,
        }

    async def due_in(self, job_id: UUID) -> float:
        return self.store.jobs[job_id].run_at - self.store.clock()

    async def make_due(self, job_id: UUID) -> None:
        self.store.jobs[job_id].run_at = self.store.clock() - 0.001

    async def expire(self, job_id: UUID) -> None:
        self.store.jobs[job_id].locked_until = self.store.clock() - 1

    async def finish_long_ago(self, job_id: UUID, status: Status) -> None:
        job = self.store.jobs[job_id]
        job.status, job.finished_at = status, self.store.clock() - 7200

    async def lock(self, job_id: UUID) -> None:
        self.store.jobs[job_id].locked = True

    async def unlock(self) -> None:
        for job in self.store.jobs.values():
            job.locked = False


class Postgres:
    """PgJobStore on the test's own database."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.store = PgJobStore(engine, limits=LIMITS)
        self._holder: Any = None

    async def add(
        self, type: str = "t", *, delay: float = 0.0, created_ago: float = 0.0, **fields: Any
    ) -> UUID:
        job_id = _created_ago(created_ago)
        max_attempts = fields.pop("max_attempts", 3)
        async with self.engine.begin() as conn:
            new = NewJob(job_id, type, {}, max_attempts, delay=delay, **fields)
            job, _ = await store.submit(conn, new)
        return job.id

    async def job(self, job_id: UUID) -> dict[str, Any] | None:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    sa.select(
                        jobs.c.status,
                        jobs.c.attempts,
                        jobs.c.last_error,
                        jobs.c.errors,
                        jobs.c.concurrency_key,
                    ).where(jobs.c.id == job_id)
                )
            ).first()
        if row is None:
            return None
        return {
            "status": Status(row.status),
            "attempts": row.attempts,
            "last_error": row.last_error,
            "errors": _entries(row.errors or []),
            "concurrency_key": row.concurrency_key,
        }

    async def due_in(self, job_id: UUID) -> float:
        seconds = sa.extract("epoch", jobs.c.run_at - sa.func.now())
        async with self.engine.connect() as conn:
            found = await conn.scalar(sa.select(seconds).where(jobs.c.id == job_id))
        return float(found)

    async def make_due(self, job_id: UUID) -> None:
        await self._update(job_id, run_at=sa.func.now())

    async def _update(self, job_id: UUID, **values: Any) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(**values))

    async def expire(self, job_id: UUID) -> None:
        await self._update(job_id, locked_until=sa.func.now() - sa.text("interval '1 second'"))

    async def finish_long_ago(self, job_id: UUID, status: Status) -> None:
        long_ago = sa.func.now() - sa.text("interval '2 hours'")
        await self._update(job_id, status=status.value, finished_at=long_ago, locked_until=None)

    async def lock(self, job_id: UUID) -> None:
        self._holder = await self.engine.connect()
        await self._holder.begin()
        await self._holder.execute(
            sa.select(jobs.c.id).where(jobs.c.id == job_id).with_for_update()
        )

    async def unlock(self) -> None:
        if self._holder is not None:
            await self._holder.rollback()
            await self._holder.close()
            self._holder = None

    async def close(self) -> None:
        await self.unlock()
        await self.store.close()


Backend = Memory | Postgres


def _entries(errors: list[dict[str, Any]]) -> list[tuple[int, str, str | None]]:
    """The (attempt, error, traceback) of each entry of `errors`; each must say when."""
    assert all(entry["at"] is not None for entry in errors), errors
    return [(entry["attempt"], entry["error"], entry["traceback"]) for entry in errors]


def _created_ago(seconds: float) -> UUID:
    """A time-ordered id (`jobcore.ids`) of `seconds` ago: retention reads a job's age of
    creation from it."""
    fresh = new_id().int
    ms = (time.time_ns() // 1_000_000 - int(seconds * 1000)) & 0xFFFF_FFFF_FFFF
    return UUID(int=(fresh & ((1 << 80) - 1)) | ms << 80)


@pytest.fixture(params=["memory", "postgres"])
async def backend(request: pytest.FixtureRequest, engine: AsyncEngine) -> AsyncIterator[Backend]:
    if request.param == "memory":
        yield Memory()
        return
    found = Postgres(engine)
    try:
        yield found
    finally:
        await found.close()


async def _status(backend: Backend, job_id: UUID) -> Status:
    job = await backend.job(job_id)
    assert job is not None
    return Status(job["status"])


# --- claims -------------------------------------------------------------------------------


async def test_a_claim_takes_due_jobs_in_claim_order_up_to_each_queues_slots(backend: Backend):
    low = await backend.add(priority=-5)
    high = await backend.add(priority=5)
    first = await backend.add()
    second = await backend.add()
    await backend.add(delay=3600)  # not due
    other = await backend.add(queue="other")
    got = await backend.store.claim({"default": 3, "other": 5}, LEASE)
    assert [job.id for job in got if job.queue == "default"] == [high, first, second]
    assert [job.id for job in got if job.queue == "other"] == [other]
    assert all(job.attempts == 1 and job.lease_token == 1 for job in got)
    assert await _status(backend, low) is Status.PENDING
    again = await backend.store.claim({"default": 3}, LEASE)
    assert [job.id for job in again] == [low]  # the scheduled one is not due


async def test_a_job_keeps_its_concurrency_key_through_its_attempt(backend: Backend):
    keyed = await backend.add(concurrency_key="tenant-7")
    plain = await backend.add()
    got = await backend.store.claim({"default": 5}, LEASE)
    assert {job.id for job in got} == {keyed, plain}  # no KEY_CONCURRENCY: no limit
    assert await backend.store.record(Operation.COMPLETE, [job.lease for job in got]) == []
    for job_id, key in ((keyed, "tenant-7"), (plain, None)):
        job = await backend.job(job_id)
        assert job is not None and job["status"] is Status.COMPLETED
        assert job["concurrency_key"] == key


async def test_the_next_due_job_is_reported_in_seconds(backend: Backend):
    assert await backend.store.next_due(["default"]) is None
    await backend.add(delay=30)
    seconds = await backend.store.next_due(["default"])
    assert seconds is not None and 25 < seconds <= 30


# --- outcomes -----------------------------------------------------------------------------


@pytest.mark.parametrize("operation", ATTEMPT_OUTCOMES, ids=str)
async def test_each_outcome_has_its_declared_effects_and_is_fenced(
    backend: Backend, operation: Operation
):
    job_id = await backend.add()
    (claimed,) = await backend.store.claim({"default": 1}, LEASE)
    stale = Lease(job_id, claimed.lease_token + 1)
    assert await backend.store.record(operation, [stale], ["x"], [60.0]) == [stale]
    lost = await backend.store.record(
        operation, [claimed.lease], ["boom"], [60.0], ["1"], tracebacks=["Traceback ..."]
    )
    assert lost == []
    job = await backend.job(job_id)
    assert job is not None
    (target,) = operation.targets - {Status.CANCELLED} or operation.targets
    assert job["status"] is target
    assert job["attempts"] == (0 if operation.gives_back else 1)
    assert job["last_error"] == ("boom" if operation.writes_error else None)
    # A failed attempt adds its entry; a success, snooze, release or cancel adds none.
    assert job["errors"] == ([(1, "boom", "Traceback ...")] if operation.writes_error else [])
    if operation.due_again:  # pending, but not due for a minute
        assert await backend.store.claim({"default": 1}, LEASE) == []
    # The lease is spent: writing again changes nothing.
    assert await backend.store.record(operation, [claimed.lease], ["x"], [0.0]) == [claimed.lease]


async def test_the_errors_keep_the_last_20_failed_attempts_oldest_dropped(backend: Backend):
    job_id = await backend.add(max_attempts=30)
    for n in range(1, 26):
        (claimed,) = await backend.store.claim({"default": 1}, LEASE)
        operation = Operation.RETRY_LATER
        await backend.store.record(operation, [claimed.lease], [f"e{n}"], [0.0])
    job = await backend.job(job_id)
    assert job is not None and job["attempts"] == 25 and job["last_error"] == "e25"
    # No traceback given: null.
    assert job["errors"] == [(n, f"e{n}", None) for n in range(6, 26)]


async def test_a_job_without_a_handler_is_given_back_due_again_later_and_later(
    backend: Backend,
):
    job_id = await backend.add(max_attempts=1)
    waits = []
    for _ in range(8):
        (claimed,) = await backend.store.claim({"default": 1}, LEASE)
        assert claimed.attempts == 1  # never spent: the last attempt stays available
        error = "no handler for type 't' in this worker"
        assert await backend.store.record(Operation.UNHANDLED, [claimed.lease], [error]) == []
        job = await backend.job(job_id)
        assert job is not None
        assert job["status"] is Status.PENDING and job["attempts"] == 0
        waits.append(await backend.due_in(job_id))
        await backend.make_due(job_id)
    # 1 s, doubling with each give-back of the same attempt, at most 60 s.
    assert [round(wait) for wait in waits] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert [unhandled_delay(n) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    job = await backend.job(job_id)
    assert job is not None and job["errors"] == [(1, error, None)] * 8


async def test_complete_and_claim_completes_and_refills_in_one_call(backend: Backend):
    done = await backend.add()
    waiting = await backend.add()
    (claimed,) = await backend.store.claim({"default": 1}, LEASE)
    lost, more = await backend.store.complete_and_claim([claimed.lease], {"default": 5}, LEASE)
    assert lost == [] and [job.id for job in more] == [waiting]
    assert await _status(backend, done) is Status.COMPLETED


# --- leases -------------------------------------------------------------------------------


async def test_a_renewal_renews_live_leases_reports_lost_ones_and_skips_locked_rows(
    backend: Backend,
):
    ids = [await backend.add() for _ in range(3)]
    claimed = await backend.store.claim({"default": 3}, LEASE)
    by_id = {job.id: job.lease for job in claimed}
    gone = Lease(ids[2], by_id[ids[2]].lease_token + 7)
    await backend.lock(ids[1])
    try:
        async with asyncio.timeout(5):
            renewed = await backend.store.renew([by_id[ids[0]], by_id[ids[1]], gone], LEASE)
    finally:
        await backend.unlock()
    assert renewed.lost == [gone]
    assert renewed.busy == [by_id[ids[1]]]
    assert renewed.cancel == []


async def test_recovery_gives_expired_jobs_back_or_dead_letters_the_last_attempt(
    backend: Backend,
):
    again = await backend.add(max_attempts=3)
    last = await backend.add(max_attempts=1)
    live = await backend.add()
    await backend.store.claim({"default": 3}, LEASE)
    await backend.expire(again)
    await backend.expire(last)
    recovered = dict(await backend.store.recover_expired())
    assert recovered == {again: Status.PENDING, last: Status.DEAD_LETTER}
    assert await _status(backend, live) is Status.PROCESSING
    assert await backend.store.recover_expired() == []
    # The lost attempt is a failed one, with no traceback: nothing raised.
    for job_id in (again, last):
        job = await backend.job(job_id)
        assert job is not None
        assert job["errors"] == [(1, "lease expired during attempt 1", None)]
    live_job = await backend.job(live)
    assert live_job is not None and live_job["errors"] == []


# --- per-type limits ----------------------------------------------------------------------


async def test_a_limited_claim_keeps_a_types_concurrency_and_leaves_the_others_in_order(
    backend: Backend,
):
    for _ in range(5):
        await backend.add("limited", priority=9)
    await backend.add("urgent", priority=50)
    for _ in range(3):
        await backend.add("plain")
    got = await backend.store.claim_limited({"default": 5}, LEASE)
    # Ranked with the others: urgent, two limited (its concurrency), then plain ones; the
    # limited claim takes only the limited jobs among the first five.
    assert Counter(job.type for job in got.jobs) == {"limited": 2}
    assert got.held == {"limited": "concurrency"}
    # The ordinary claims take the others and skip the limited type.
    rest = await backend.store.claim({"default": 5}, LEASE)
    assert Counter(job.type for job in rest) == {"urgent": 1, "plain": 3}
    # A handler running on after its attempt still holds its unit.
    one = got.jobs[[job.type for job in got.jobs].index("limited")]
    await backend.store.record(Operation.FAIL, [one.lease], ["timed out"])
    held = await backend.store.claim_limited({"default": 5}, LEASE, {"limited": 1})
    assert held.jobs == [] and held.held == {"limited": "concurrency"}
    freed = await backend.store.claim_limited({"default": 5}, LEASE)
    assert [job.type for job in freed.jobs] == ["limited"]


# --- maintenance --------------------------------------------------------------------------


async def test_one_holder_leads_a_task_until_it_resigns(backend: Backend):
    first, second = new_id(), new_id()
    assert await backend.store.take_lead("retention", first, LEASE)
    assert not await backend.store.take_lead("retention", second, LEASE)
    assert await backend.store.take_lead("retention", first, LEASE)  # kept
    await backend.store.resign("retention", first)
    assert await backend.store.take_lead("retention", second, LEASE)


async def test_queue_depths_count_due_scheduled_processing_and_dead_letters(backend: Backend):
    await backend.add()
    await backend.add(delay=3600)
    await backend.add(queue="bulk")
    await backend.store.claim({"bulk": 1}, LEASE)
    depths = {depth.queue: depth for depth in await backend.store.queue_depths()}
    assert set(depths) == {"default", "bulk"}
    default, bulk = depths["default"], depths["bulk"]
    assert (default.pending, default.scheduled, default.processing) == (1, 1, 0)
    assert (bulk.pending, bulk.scheduled, bulk.processing, bulk.dead_letter) == (0, 0, 1, 0)


@pytest.mark.parametrize("status", sorted(FINISHED), ids=str)
async def test_retention_prunes_only_jobs_of_its_status_finished_long_enough_ago(
    backend: Backend, status: Status
):
    old = await backend.add(created_ago=7300)
    await backend.finish_long_ago(old, status)
    young = await backend.add()
    (claimed,) = await backend.store.claim({"default": 1}, LEASE)
    assert claimed.id == young
    await backend.store.record(Operation.COMPLETE, [claimed.lease])
    assert await backend.store.prune(status, 3600) == 1
    assert await backend.job(old) is None
    assert await backend.job(young) is not None
    assert await backend.store.prune(status, 3600) == 0
