"""Heartbeats over an in-memory store: the leases of running attempts are renewed; a lease
found lost (or run out by the process's own clock) stops its attempt, which writes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from jobcore import JobContext, handler
from jobcore.states import Status
from jobqueue_worker.heartbeat import Heartbeat
from tests.worker.fakestore import FakeStore
from tests.worker.stack import Stack
from tests.worker.support import until

stopped: dict[str, bool] = {}


@handler("unit.heartbeat.long")
async def long(payload: Any, ctx: JobContext) -> None:
    try:
        await asyncio.sleep(payload["seconds"])
    except asyncio.CancelledError:
        stopped[str(ctx.job_id)] = True
        raise


async def test_a_job_longer_than_its_lease_keeps_it_while_heartbeats_renew_it():
    store = FakeStore()
    job = store.add("unit.heartbeat.long", {"seconds": 1.0})
    async with Stack(store, slots=1, lease_seconds=0.3, job_timeout=5.0) as stack:
        beat = Heartbeat(store, stack.executor, 0.3)
        stop = asyncio.Event()
        beating = asyncio.create_task(beat.run(stop))
        await until(lambda: store.status(job) is Status.COMPLETED, 5, "the job completed")
        stop.set()
        await beating
    assert len(store.renewals) >= 3  # every 0.1 s during the one-second job
    assert store.writes == [("complete", 1)]


async def test_a_renewal_that_finds_the_lease_lost_stops_the_attempt_and_writes_nothing():
    store = FakeStore()
    job = store.add("unit.heartbeat.long", {"seconds": 30})
    async with Stack(store, slots=1, lease_seconds=60, job_timeout=60) as stack:
        await until(lambda: store.status(job) is Status.PROCESSING, 5, "the job running")
        store.jobs[job].lease_token += 1  # recovered and re-claimed elsewhere meanwhile
        assert await Heartbeat(store, stack.executor, 60).run_once() == 0
        await until(lambda: stopped.get(str(job)), 5, "the handler cancelled")
        await until(lambda: stack.executor.running == 0, 5, "the slot freed")
    assert store.writes == []  # no outcome written for a lease another claim owns


async def test_a_lease_run_out_by_the_process_clock_is_lost_even_without_the_database():
    now = [0.0]
    store = FakeStore()
    job = store.add("unit.heartbeat.long", {"seconds": 30})
    async with Stack(store, slots=1, lease_seconds=10, job_timeout=60) as stack:
        await until(lambda: store.status(job) is Status.PROCESSING, 5, "the job running")
        store.down = True  # renewals fail from now on
        beat = Heartbeat(store, stack.executor, 10, clock=lambda: now[0] + 1e9)
        assert await beat.run_once() == 0  # nothing renewable: every lease ran out
        await until(lambda: stack.executor.running == 0, 5, "the attempt stopped")
        store.down = False
    assert store.writes == []


async def test_a_locked_job_row_keeps_its_attempt_running_and_the_others_are_renewed():
    stopped.clear()
    store = FakeStore()
    ids = [store.add("unit.heartbeat.long", {"seconds": 30}) for _ in range(3)]
    async with Stack(store, slots=3, lease_seconds=60, job_timeout=60) as stack:
        await until(
            lambda: all(store.status(i) is Status.PROCESSING for i in ids), 5, "all running"
        )
        store.jobs[ids[1]].locked = True  # another transaction holds its row
        assert await Heartbeat(store, stack.executor, 60).run_once() == 2
        assert stack.executor.running == 3  # no attempt stopped for a lock
        assert not any(stopped.get(str(i)) for i in ids)
    assert store.writes == [("release", 3)]  # handed back at shutdown, none lost
