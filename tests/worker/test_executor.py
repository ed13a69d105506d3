"""Executor over an in-memory store: one outcome per attempt, whatever the handler does,
and shutdown semantics (finish within SHUTDOWN_TIMEOUT, then release)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

from jobcore import JobContext, PermanentError, handler
from jobcore.states import Status
from tests.worker.fakestore import FakeStore
from tests.worker.stack import Stack
from tests.worker.support import until

seen: dict[str, Any] = {}


@handler("unit.exec.ok")
async def ok(payload: Any, ctx: JobContext) -> None:
    seen["ctx"] = ctx


@handler("unit.exec.permanent")
async def permanent(payload: Any, ctx: JobContext) -> None:
    raise PermanentError("bad input")


@handler("unit.exec.boom")
async def boom(payload: Any, ctx: JobContext) -> None:
    raise ValueError("boom\x00with a NUL")


@handler("unit.exec.slow")
async def slow(payload: Any, ctx: JobContext) -> None:
    started = time.monotonic()
    try:
        await asyncio.sleep(payload["seconds"])
    finally:
        seen["slow_ran"] = time.monotonic() - started


@handler("unit.exec.thread")
def in_thread(payload: Any, ctx: JobContext) -> None:
    seen["thread"] = threading.current_thread()
    time.sleep(payload.get("seconds", 0))


@handler("unit.exec.stubborn")
async def stubborn(payload: Any, ctx: JobContext) -> None:
    """Swallows the first cancellation and keeps going for a while: slow to honour it."""
    try:
        await asyncio.sleep(payload["seconds"])
    except asyncio.CancelledError:
        await asyncio.sleep(payload["seconds"])


# Releases the handlers below that ignore their interruption, once a test is done with them.
_let_go = threading.Event()


@handler("unit.exec.deaf")
async def deaf(payload: Any, ctx: JobContext) -> None:
    """Swallows every cancellation until the test lets it go."""
    while not _let_go.is_set():
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            seen.setdefault("deaf_cancelled", 0)
            seen["deaf_cancelled"] += 1
    seen["deaf_returned"] = True


@handler("unit.exec.blocking")
def blocking(payload: Any, ctx: JobContext) -> None:
    """Blocks its thread until the test lets it go."""
    _let_go.wait(30)


@handler("unit.exec.quick-thread")
def quick_thread(payload: Any, ctx: JobContext) -> None:
    seen.setdefault("quick_ran", []).append(ctx.job_id)


_RAISERS = {
    "system-exit": SystemExit(3),
    "keyboard-interrupt": KeyboardInterrupt(),
    "cancelled": asyncio.CancelledError(),
    "generator-exit": GeneratorExit(),
}


@handler("unit.exec.raise-base")
async def raise_base(payload: Any, ctx: JobContext) -> None:
    raise _RAISERS[payload["what"]]


@handler("unit.exec.raise-base-in-thread")
def raise_base_in_thread(payload: Any, ctx: JobContext) -> None:
    raise _RAISERS[payload["what"]]


@handler("unit.exec.cancel-self")
async def cancel_self(payload: Any, ctx: JobContext) -> None:
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    await asyncio.sleep(1)


async def _run_until_settled(store: FakeStore, **stack: Any) -> None:
    def settled() -> bool:
        return all(j.status is not Status.PROCESSING and j.attempts for j in store.jobs.values())

    async with Stack(store, **stack):
        await until(settled, 20, "every job attempted once and recorded")


async def test_success_completes_and_the_handler_gets_its_context():
    store = FakeStore()
    job = store.add("unit.exec.ok", max_attempts=4)
    await _run_until_settled(store)
    assert store.status(job) is Status.COMPLETED
    ctx = seen["ctx"]
    assert (ctx.job_id, ctx.type, ctx.attempt, ctx.max_attempts) == (job, "unit.exec.ok", 1, 4)
    assert ctx.lease_token == store.jobs[job].lease_token


async def test_permanent_error_fails_at_once():
    store = FakeStore()
    perm = store.add("unit.exec.permanent", max_attempts=5)
    await _run_until_settled(store)
    assert store.status(perm) is Status.FAILED
    assert store.jobs[perm].last_error == "PermanentError: bad input"
    assert store.jobs[perm].attempts == 1


async def test_retryable_error_retries_with_backoff_then_dead_letters_on_the_last_attempt():
    store = FakeStore()
    first = store.add("unit.exec.boom", max_attempts=3)
    last = store.add("unit.exec.boom", max_attempts=1)
    await _run_until_settled(store, backoff_base=10.0, backoff_max=60.0)
    retried = store.jobs[first]
    assert retried.status is Status.PENDING
    assert retried.delay is not None and 5.0 <= retried.delay <= 10.0  # attempt 1: [c/2, c], c=10
    assert retried.last_error == "ValueError: boom\\x00with a NUL"  # storable in TEXT
    assert store.status(last) is Status.DEAD_LETTER


async def test_timeout_is_retryable_and_never_early():
    store = FakeStore()
    job = store.add("unit.exec.slow", {"seconds": 30}, max_attempts=2)
    started = time.monotonic()
    await _run_until_settled(store, job_timeout=0.2, backoff_base=30.0)
    assert time.monotonic() - started < 10
    assert seen["slow_ran"] >= 0.2  # interrupted after JOB_TIMEOUT, not before
    assert store.status(job) is Status.PENDING
    assert "timed out after 0.2s" in (store.jobs[job].last_error or "")


async def test_plain_def_handler_runs_in_a_thread():
    store = FakeStore()
    job = store.add("unit.exec.thread")
    await _run_until_settled(store)
    assert store.status(job) is Status.COMPLETED
    assert seen["thread"] is not threading.main_thread()


@pytest.mark.parametrize("what", sorted(_RAISERS))
async def test_base_exceptions_from_handlers_are_retried_and_never_kill_the_loop(what):
    store = FakeStore()
    in_task = store.add("unit.exec.raise-base", {"what": what})
    in_thread = store.add("unit.exec.raise-base-in-thread", {"what": what})
    self_cancelled = store.add("unit.exec.cancel-self")
    after = store.add("unit.exec.ok")
    await _run_until_settled(store, slots=1, backoff_base=30.0)
    for job in (in_task, in_thread, self_cancelled):
        assert store.status(job) is Status.PENDING, store.jobs[job]
        assert store.jobs[job].attempts == 1
    assert store.status(after) is Status.COMPLETED  # the loop went on


class LateClaims(FakeStore):
    """Answers its first claim only after `late` seconds, as a claim whose commit waited (on
    a synchronous standby that was away, say) is answered."""

    def __init__(self, late: float) -> None:
        super().__init__()
        self.late = late

    async def claim(self, slots: Any, lease_seconds: float) -> Any:
        claimed = await super().claim(slots, lease_seconds)
        if claimed:
            await asyncio.sleep(self.late)
            self.late = 0.0
        return claimed


async def test_a_claim_answered_after_its_lease_ran_out_runs_nothing(caplog):
    # The lease ran out before the answer came: the job may be taken back and run elsewhere
    # at any moment, so the handler must not start (the next heartbeat would only stop it).
    seen.pop("ctx", None)
    store = LateClaims(late=0.3)
    job = store.add("unit.exec.ok")
    stopped = "lease lost, attempt stopped"
    with caplog.at_level(logging.WARNING, logger="jobqueue.worker"):
        async with Stack(store, lease_seconds=0.2) as stack:

            def settled() -> bool:
                ended = "ctx" in seen or stopped in [r.getMessage() for r in caplog.records]
                return ended and stack.executor.running == 0

            await until(settled, 5, "the attempt run or dropped")
    assert "ctx" not in seen
    assert store.status(job) is Status.PROCESSING  # recovery's to take back; nothing written
    assert [r.getMessage() for r in caplog.records] == [stopped]


async def test_slot_is_freed_only_after_the_outcome_is_recorded():
    store = FakeStore()
    store.write_gate = asyncio.Event()
    job = store.add("unit.exec.ok")
    async with Stack(store, slots=1) as stack:
        await until(lambda: "ctx" in seen and seen["ctx"].job_id == job, 5, "the handler ran")
        await asyncio.sleep(0.1)
        assert stack.executor.free == {"default": 0}  # handler done, write pending: slot still held
        store.write_gate.set()
        await until(
            lambda: stack.executor.free == {"default": 1}, 5, "the slot freed after the write"
        )
    assert store.status(job) is Status.COMPLETED


async def test_shutdown_lets_running_jobs_finish_within_shutdown_timeout():
    store = FakeStore()
    jobs = [store.add("unit.exec.slow", {"seconds": 0.3}) for _ in range(2)]
    stack = Stack(store, slots=2, poll_interval=0.02)
    async with stack:
        await until(lambda: stack.executor.running == 2, 5, "both jobs running")
        late = store.add("unit.exec.ok")
        await stack.shutdown(5.0)
    assert [store.status(j) for j in jobs] == [Status.COMPLETED, Status.COMPLETED]
    assert store.status(late) is Status.PENDING and store.jobs[late].attempts == 0


async def test_shutdown_releases_jobs_past_shutdown_timeout_without_spending_an_attempt():
    store = FakeStore()
    cooperative = store.add("unit.exec.slow", {"seconds": 60})
    stubborn_job = store.add("unit.exec.stubborn", {"seconds": 60})
    threaded = store.add("unit.exec.thread", {"seconds": 3})
    stack = Stack(store, slots=3, job_timeout=120.0, cancel_grace=0.2)
    async with stack:
        await until(lambda: stack.executor.running == 3, 5, "all three jobs running")
        started = time.monotonic()
        await stack.shutdown(0.3)
        # Neither a handler that ignores cancellation nor a thread holds the shutdown.
        assert time.monotonic() - started < 2.0
    for job in (cooperative, stubborn_job, threaded):
        assert store.status(job) is Status.PENDING
        assert store.jobs[job].attempts == 0
    assert sum(n for op, n in store.writes if op == "release") == 3


@pytest.mark.parametrize("kind", ["deaf", "blocking"])
async def test_a_handler_that_ignores_its_timeout_cannot_hold_its_slot(kind, caplog):
    _let_go.clear()
    seen.pop("deaf_returned", None)
    store = FakeStore()
    stuck = store.add(f"unit.exec.{kind}", max_attempts=3)
    after = store.add("unit.exec.ok")
    stack = Stack(store, slots=1, job_timeout=0.2, cancel_grace=0.2, backoff_base=30.0)
    try:
        async with stack:
            # The only slot moves on to the next job although the handler never stops.
            await until(lambda: store.status(after) is Status.COMPLETED, 10, "the next job")
            assert store.status(stuck) is Status.PENDING  # retried: a timeout is retryable
            assert "timed out after 0.2s" in (store.jobs[stuck].last_error or "")
            _let_go.set()
            if kind == "deaf":
                await until(lambda: seen.get("deaf_returned"), 5, "the deaf handler to return")
                # Each interruption reached it; it swallowed them all.
                assert seen["deaf_cancelled"] >= 1
                warned = [r for r in caplog.records if "did not stop" in r.getMessage()]
                assert [r.job_id for r in warned] == [str(stuck)]  # type: ignore[attr-defined]
            await asyncio.sleep(0.1)
    finally:
        _let_go.set()
    # The late return of the abandoned attempt recorded nothing more: one outcome per attempt.
    assert store.jobs[stuck].attempts == 1
    assert sorted(store.writes) == [("complete", 1), ("retry_later", 1)]


async def test_hung_sync_handlers_do_not_starve_later_sync_jobs(caplog):
    """Two plain handlers that never return, two slots: three quick plain jobs still run
    (their timeout starts when their handler does, not while they wait for a thread)."""
    caplog.set_level(logging.INFO, logger="jobqueue.worker")
    _let_go.clear()
    seen.pop("quick_ran", None)
    store = FakeStore()
    hung = [store.add("unit.exec.blocking", max_attempts=1) for _ in range(2)]
    stack = Stack(store, slots=2, job_timeout=0.3, backoff_base=30.0)
    reported: list[int] = []
    stack.executor.on_abandoned = reported.append
    try:
        async with stack:
            await until(
                lambda: all(store.status(j) is Status.DEAD_LETTER for j in hung), 10, "timeouts"
            )
            quick = [store.add("unit.exec.quick-thread", max_attempts=1) for _ in range(3)]
            stack.dispatcher.wake()
            await until(
                lambda: all(store.status(j) is not Status.PENDING for j in quick), 10, "quick jobs"
            )
            assert [store.status(j) for j in quick] == [Status.COMPLETED] * 3
            assert sorted(seen["quick_ran"]) == sorted(quick)
            assert stack.executor.abandoned == 2
            warned = [r for r in caplog.records if r.getMessage() == "handler thread abandoned"]
            assert sorted(r.job_id for r in warned) == sorted(str(j) for j in hung)  # type: ignore[attr-defined]
            _let_go.set()
            await until(lambda: stack.executor.abandoned == 0, 5, "the hung threads to return")
    finally:
        _let_go.set()
    assert reported == [1, 2, 1, 0]
    returned = [r for r in caplog.records if r.getMessage() == "abandoned handler returned"]
    assert len(returned) == 2
    # Nothing was written for the late returns: one outcome per attempt.
    written: dict[str, int] = {}
    for op, n in store.writes:
        written[op] = written.get(op, 0) + n
    assert written == {"complete": 3, "dead_letter": 2}


async def test_an_async_handler_ignoring_cancellation_counts_as_abandoned_until_it_returns():
    _let_go.clear()
    store = FakeStore()
    store.add("unit.exec.deaf", max_attempts=1)
    stack = Stack(store, slots=1, job_timeout=0.2, cancel_grace=0.2)
    try:
        async with stack:
            await until(lambda: stack.executor.abandoned == 1, 5, "the deaf handler abandoned")
            _let_go.set()
            await until(lambda: stack.executor.abandoned == 0, 5, "the deaf handler returned")
    finally:
        _let_go.set()
