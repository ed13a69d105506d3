"""The dispatcher over an in-memory store: slots bound concurrency, claims match free slots."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from jobcore import JobContext, handler
from jobcore.states import Status
from jobqueue_worker import dispatcher as dispatcher_module
from tests.worker.fakestore import FakeStore
from tests.worker.stack import Stack
from tests.worker.support import until

_running = 0
_most = 0


@handler("unit.dispatch.concurrent")
async def concurrent(payload: Any, ctx: JobContext) -> None:
    global _running, _most
    _running += 1
    _most = max(_most, _running)
    try:
        await asyncio.sleep(payload["seconds"])
    finally:
        _running -= 1


def _all_done(store: FakeStore) -> bool:
    return all(job.status is Status.COMPLETED for job in store.jobs.values())


async def test_never_more_than_workers_jobs_run_at_once_and_every_claim_runs():
    global _most
    _most = 0
    store = FakeStore()
    for i in range(40):
        store.add("unit.dispatch.concurrent", {"seconds": 0.002 * (i % 7)})
    async with Stack(store, slots=3) as stack:
        await until(lambda: _all_done(store), 20, "every job completed")
        assert stack.executor.running == 0
    assert _most == 3  # the slots were used to the full, never beyond
    # Every claimed job was handed to a slot: the claims took exactly the jobs that completed.
    assert all(job.attempts == 1 for job in store.jobs.values())


async def test_claim_asks_for_exactly_the_free_slots():
    store = FakeStore()
    for i in range(30):
        # Quick and slow jobs mixed, so slots free up at different times.
        store.add("unit.dispatch.concurrent", {"seconds": 0.05 if i % 2 else 0})
    stack = Stack(store, slots=4)
    free_at_claim: list[int] = []
    store.on_claim = lambda n: free_at_claim.append(sum(stack.executor.free.values()))
    async with stack:
        await until(lambda: _all_done(store), 20, "every job completed")
    assert store.claims == free_at_claim
    assert all(1 <= n <= 4 for n in store.claims)
    assert any(n < 4 for n in store.claims)  # slots freed one by one were refilled one by one


async def test_a_freed_slot_after_a_full_claim_claims_again_without_waiting_for_the_poll():
    store = FakeStore()
    for _ in range(12):
        store.add("unit.dispatch.concurrent", {"seconds": 0.01})
    started = time.monotonic()
    async with Stack(store, slots=2, poll_interval=60.0):
        await until(lambda: _all_done(store), 20, "every job completed")
    assert time.monotonic() - started < 10  # far below one 60 s poll interval


async def test_wake_cuts_the_idle_wait_short():
    store = FakeStore()
    async with Stack(store, slots=2, poll_interval=60.0) as stack:
        await until(lambda: store.claims, 5, "the first, empty claim")
        job = store.add("unit.dispatch.concurrent", {"seconds": 0})
        await asyncio.sleep(0.1)
        assert store.status(job) is Status.PENDING  # idle: waiting out the poll interval
        stack.dispatcher.wake()
        await until(lambda: store.status(job) is Status.COMPLETED, 5, "the job after wake()")


async def test_a_failing_claim_backs_off_and_resumes_by_itself():
    store = FakeStore()
    store.down = True
    async with Stack(store, slots=2, poll_interval=0.01):
        await asyncio.sleep(1.0)
        # Polling every 10 ms would be ~100 attempts; backoff keeps an outage quiet.
        assert 2 <= store.failed_calls <= 6
        job = store.add("unit.dispatch.concurrent", {"seconds": 0})
        store.down = False
        await until(lambda: store.status(job) is Status.COMPLETED, 10, "the job after the outage")


async def test_stop_claims_nothing_more():
    store = FakeStore()
    async with Stack(store, slots=2, poll_interval=0.02) as stack:
        await until(lambda: store.claims, 5, "the first claim")
        stack.dispatcher.stop()
        await asyncio.sleep(0.1)
        claims = len(store.claims)
        job = store.add("unit.dispatch.concurrent", {"seconds": 0})
        await asyncio.sleep(0.2)
        assert len(store.claims) == claims
        assert store.status(job) is Status.PENDING


async def test_a_completing_write_claims_exactly_for_the_slots_it_frees():
    global _most
    _most = 0
    store = FakeStore()
    for _ in range(40):
        store.add("unit.dispatch.concurrent", {"seconds": 0.01})
    async with Stack(store, slots=4, poll_interval=60.0):
        await until(lambda: _all_done(store), 20, "every job completed")
    # Refilled by the writes that completed jobs, never beyond the slots they freed (no
    # slot was idle when a write began: every claim got what it asked for).
    assert store.combined and all(n == completions for completions, n in store.combined)
    assert sum(n for _, n in store.combined) + sum(store.claims) >= 40
    assert _most <= 4
    assert all(job.attempts == 1 for job in store.jobs.values())


async def test_slots_a_short_write_claim_left_idle_go_to_the_next_write_not_a_claim_of_their_own():
    """Four slots, six short jobs: the write completing the first four claims four and gets
    two (more jobs arrive only after it). The two slots it left idle are not claimed on
    their own (a second group of jobs, written apart from then on) while two jobs still
    run: the write that completes those claims for its two slots and the two idle ones."""
    global _most
    _most = 0
    store = FakeStore()
    for _ in range(6):
        store.add("unit.dispatch.concurrent", {"seconds": 0.005})
    write = store.complete_and_claim

    async def complete_and_claim(*args: Any, **kwargs: Any) -> Any:
        result = await write(*args, **kwargs)
        if len(store.combined) == 1:
            for _ in range(10):
                store.add("unit.dispatch.concurrent", {"seconds": 0.005})
        return result

    store.complete_and_claim = complete_and_claim  # type: ignore[method-assign]
    async with Stack(store, slots=4, poll_interval=60.0):
        await until(lambda: _all_done(store), 20, "every job completed")
    assert store.claims[:1] == [4] and store.combined[:2] == [(4, 4), (2, 4)], (
        store.claims,
        store.combined,
    )
    assert _most <= 4
    assert all(job.attempts == 1 for job in store.jobs.values())


async def test_a_job_due_while_a_write_held_every_free_slot_is_claimed_once_the_write_returns():
    """Two slots: A runs, B is due a moment later. A's write holds the other slot while in
    flight, and its claim, made before B was due, gets nothing; the dispatcher, waking for
    B meanwhile, finds every free slot held. Once the write returns, it claims B (long
    before the poll interval)."""
    store = FakeStore()
    a = store.add("unit.dispatch.concurrent", {"seconds": 0.05})
    b = store.add("unit.dispatch.concurrent", {"seconds": 0}, run_at=store.clock() + 0.1)
    write = store.complete_and_claim

    async def slow_complete_and_claim(*args: Any, **kwargs: Any) -> Any:
        result = await write(*args, **kwargs)
        await asyncio.sleep(0.15)  # its answer comes after B is due
        return result

    store.complete_and_claim = slow_complete_and_claim  # type: ignore[method-assign]
    async with Stack(store, slots=2, poll_interval=60.0):
        await until(lambda: store.status(b) is Status.COMPLETED, 5, "B completed")
    assert store.status(a) is Status.COMPLETED
    # A's write asked for its slot and the idle one; B was claimed by the dispatcher.
    assert store.combined[0] == (1, 2) and len(store.claims) == 2, (store.combined, store.claims)


async def test_a_job_that_falls_due_while_idle_slots_wait_for_a_write_starts_on_time(monkeypatch):
    """Three slots: L runs for 1.5 s, Q ends at once, S is due 0.3 s after the start. Q's
    write claims for its slot and the idle one and gets nothing (S is not due yet): those
    slots are left to the next write while L runs, but not past S's time, when the
    dispatcher claims S itself (with the wait for a write made long, S would otherwise
    wait for L's write)."""
    monkeypatch.setattr(dispatcher_module, "MERGE_WAIT", 5.0)
    store = FakeStore()
    start = store.clock()
    store.add("unit.dispatch.concurrent", {"seconds": 1.5})
    store.add("unit.dispatch.concurrent", {"seconds": 0})
    s = store.add("unit.dispatch.concurrent", {"seconds": 0}, run_at=start + 0.3)
    async with Stack(store, slots=3, poll_interval=60.0):
        await until(lambda: store.status(s) is Status.COMPLETED, 5, "S completed")
        started = store.clock() - start
    assert started < 1.0, f"S completed {started:.2f}s after the start"
    assert store.combined[0] == (1, 2), store.combined


async def test_once_stopped_completing_writes_claim_nothing():
    store = FakeStore()
    first = [store.add("unit.dispatch.concurrent", {"seconds": 0.2}) for _ in range(2)]
    later = [store.add("unit.dispatch.concurrent", {"seconds": 0}) for _ in range(3)]
    stack = Stack(store, slots=2, poll_interval=60.0)
    async with stack:
        await until(lambda: stack.executor.running == 2, 5, "two jobs running")
        stack.dispatcher.stop()
        await until(lambda: all(store.status(j) is Status.COMPLETED for j in first), 5, "done")
    assert store.combined == []
    assert [store.status(j) for j in later] == [Status.PENDING] * 3


async def test_jobs_claimed_by_a_write_in_flight_at_shutdown_get_the_shutdown_timeout():
    store = FakeStore()
    first = [store.add("unit.dispatch.concurrent", {"seconds": 0.05}) for _ in range(2)]
    refill = [store.add("unit.dispatch.concurrent", {"seconds": 0.3}) for _ in range(2)]
    store.write_gate = asyncio.Event()
    stack = Stack(store, slots=2, poll_interval=60.0)
    async with stack:
        await until(lambda: stack.executor.running == 2, 5, "two jobs running")
        await asyncio.sleep(0.2)  # both finished; their write (claiming two more) waits
        shutdown = asyncio.create_task(stack.shutdown(10.0))
        await asyncio.sleep(0.1)
        store.write_gate.set()
        await shutdown
    assert store.combined == [(2, 2)]
    # The refill ran to completion within SHUTDOWN_TIMEOUT instead of being released.
    assert [store.status(j) for j in first + refill] == [Status.COMPLETED] * 4
    assert not [op for op, _ in store.writes if op == "release"]
