"""The batched completer over an in-memory store: batching, fencing, retries, flushing."""

from __future__ import annotations

import asyncio
import logging
import time

from jobcore.rows import Lease
from jobcore.states import Status
from jobqueue_worker.completer import Completer, Outcome
from tests.worker.fakestore import FakeStore
from tests.worker.support import until


async def _claimed(store: FakeStore, n: int, max_attempts: int = 3) -> list[Lease]:
    for _ in range(n):
        store.add("unit.completer", max_attempts=max_attempts)
    return [job.lease for job in await store.claim({"default": n}, 60)]


def _outcome(kind: str, lease: Lease, deadline: float | None = None, **kw: object) -> Outcome:
    until = time.monotonic() + 60 if deadline is None else deadline
    return Outcome(kind, lease, "default", lambda: until, **kw)  # type: ignore[arg-type]


async def test_outcomes_waiting_together_are_written_in_one_statement_per_kind():
    store = FakeStore()
    leases = await _claimed(store, 10)
    completer = Completer(store, batch_size=100, linger=0.05)
    runner = asyncio.create_task(completer.run())
    kinds = ["complete"] * 6 + ["fail"] * 2 + ["retry_later"] * 2
    results = await asyncio.gather(
        *(
            completer.record(_outcome(kind, lease, error="e", delay=5.0))
            for kind, lease in zip(kinds, leases, strict=True)
        )
    )
    completer.close()
    await runner
    assert results == [True] * 10
    assert sorted(store.writes) == [("complete", 6), ("fail", 2), ("retry_later", 2)]


async def test_a_full_batch_is_written_without_waiting_for_the_linger():
    store = FakeStore()
    leases = await _claimed(store, 4)
    completer = Completer(store, batch_size=4, linger=30.0)
    runner = asyncio.create_task(completer.run())
    started = time.monotonic()
    await asyncio.gather(*(completer.record(_outcome("complete", lease)) for lease in leases))
    assert time.monotonic() - started < 5
    assert store.writes == [("complete", 4)]
    completer.close()
    await runner


async def test_a_lost_lease_is_logged_with_job_and_token_and_reported(caplog):
    store = FakeStore()
    (lease,) = await _claimed(store, 1)
    stale = Lease(lease.job_id, lease.lease_token - 1)
    completer = Completer(store, linger=0.001)
    runner = asyncio.create_task(completer.run())
    with caplog.at_level(logging.WARNING):
        assert await completer.record(_outcome("complete", stale)) is False
    assert store.status(lease.job_id) is Status.PROCESSING  # the stale write changed nothing
    (line,) = [r for r in caplog.records if r.getMessage() == "lease lost"]
    assert (line.job_id, line.lease_token) == (str(lease.job_id), stale.lease_token)  # type: ignore[attr-defined]
    completer.close()
    await runner


async def test_a_failed_write_is_retried_while_the_lease_holds():
    store = FakeStore()
    (lease,) = await _claimed(store, 1)
    store.down = True
    completer = Completer(store, linger=0.001)
    runner = asyncio.create_task(completer.run())
    recording = asyncio.create_task(completer.record(_outcome("complete", lease)))
    await until(lambda: store.failed_calls >= 3, 10, "three failed writes")
    assert not recording.done()  # the slot still waits
    store.down = False
    assert await recording is True
    assert store.status(lease.job_id) is Status.COMPLETED
    completer.close()
    await runner


async def test_a_write_is_given_up_once_the_lease_has_run_out(caplog):
    store = FakeStore()
    (lease,) = await _claimed(store, 1)
    store.down = True
    completer = Completer(store, linger=0.001)
    runner = asyncio.create_task(completer.run())
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        applied = await completer.record(_outcome("complete", lease, time.monotonic() + 0.3))
    assert applied is False
    assert time.monotonic() - started < 3
    assert any(r.getMessage() == "lease lost" for r in caplog.records)
    completer.close()
    await runner


async def test_close_flushes_what_is_waiting_without_lingering():
    store = FakeStore()
    (lease,) = await _claimed(store, 1)
    completer = Completer(store, batch_size=50, linger=30.0)
    runner = asyncio.create_task(completer.run())
    recording = asyncio.create_task(completer.record(_outcome("release", lease)))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    completer.close()
    assert await recording is True
    await runner
    assert time.monotonic() - started < 5
    assert store.jobs[lease.job_id].attempts == 0  # release gives the attempt back


async def test_without_linger_a_lone_outcome_is_written_at_once_and_a_burst_together():
    store = FakeStore()
    leases = await _claimed(store, 11)
    completer = Completer(store, batch_size=50)  # linger 0, the worker's setting
    runner = asyncio.create_task(completer.record(_outcome("complete", leases[0])))
    writer = asyncio.create_task(completer.run())
    # No timer involved: a few turns of the loop are enough.
    for _ in range(5):
        await asyncio.sleep(0)
    assert store.writes == [("complete", 1)]
    assert await runner is True
    # Outcomes handed over in one turn of the loop (a claim's jobs finishing) share a write.
    results: list[bool] = []
    for lease in leases[1:]:
        completer.add(_outcome("complete", lease), results.append)
    await until(lambda: len(results) == 10, 5, "the burst recorded")
    assert store.writes == [("complete", 1), ("complete", 10)]
    completer.close()
    await writer


async def test_a_write_whose_lease_a_heartbeat_extended_is_retried_until_the_new_deadline():
    """The lease an outcome waits under is the one the heartbeat keeps renewing, not the
    one it had when the attempt ended: the write is not given up while the lease holds."""
    store = FakeStore()
    (lease,) = await _claimed(store, 1)
    deadline = [time.monotonic() + 0.2]
    completer = Completer(store)
    runner = asyncio.create_task(completer.run())
    store.down = True
    applied: list[bool] = []
    completer.add(Outcome("complete", lease, "default", lambda: deadline[0]), applied.append)  # type: ignore[arg-type]
    deadline[0] = time.monotonic() + 30  # renewed meanwhile
    await asyncio.sleep(0.6)  # past the first deadline: still being retried
    assert applied == []
    store.down = False
    await until(lambda: applied, 10, "the outcome written")
    assert applied == [True]
    completer.close()
    await runner


async def test_a_completion_whose_claim_keeps_failing_is_written_without_the_claim():
    store = FakeStore()
    (lease,) = await _claimed(store, 1)
    store.add("unit.completer")  # a job the combined write would claim

    async def failing_claim(*args: object) -> object:
        raise ConnectionError("the claim part fails")

    store.complete_and_claim = failing_claim  # type: ignore[method-assign]

    class Claimer:
        lease_seconds = 60.0
        dropped = 0

        def claimable(self, freeing):
            return dict(freeing)

        def hand_out(self, jobs, asked, claimed_at):
            pass

        def claim_dropped(self):
            # The slots the failed claim held are given back for any claim.
            self.dropped += 1

        def finishing(self, job_ids, limited):
            list(job_ids)

        def wake(self):
            pass

    claimer = Claimer()
    completer = Completer(store, claimer=claimer)  # type: ignore[arg-type]
    runner = asyncio.create_task(completer.run())
    applied: list[bool] = []
    completer.add(_outcome("complete", lease), applied.append)
    await until(lambda: applied, 10, "the completion written")
    assert applied == [True] and store.writes == [("complete", 1)]
    assert claimer.dropped == 1
    completer.close()
    await runner
