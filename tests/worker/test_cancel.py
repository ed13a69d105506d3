"""Cancel of a running job, in the executor over an in-memory store: the attempt is stopped
(an async handler cancelled, a plain one told through `ctx.cancelled`, one that ignores it
abandoned) and recorded `cancel_attempt`; an outcome settled before the cancel stands."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from jobcore import JobContext, handler
from jobcore.rows import Claimed
from jobcore.states import Operation, Status
from jobqueue_worker.completer import Outcome, Recorded
from jobqueue_worker.executor import CANCEL_GRACE, Executor
from jobqueue_worker.heartbeat import Heartbeat
from tests.worker.fakestore import FakeStore
from tests.worker.stack import Stack
from tests.worker.support import until

seen: dict[str, Any] = {}
# Lets the handlers below that ignore their interruption return, once a test is done.
_let_go = threading.Event()


@handler("unit.cancel.async")
async def sleeper(payload: Any, ctx: JobContext) -> None:
    seen["ctx"] = ctx
    try:
        await asyncio.sleep(payload.get("seconds", 30))
    except asyncio.CancelledError:
        seen["async_stopped"] = ctx.cancelled.is_set()
        raise
    seen["async_done"] = True


@handler("unit.cancel.polls")
def polls(payload: Any, ctx: JobContext) -> str:
    """A plain handler that waits on ctx.cancelled instead of sleeping."""
    seen["ctx"] = ctx
    if ctx.cancelled.wait(payload.get("seconds", 30)):
        seen["sync_stopped"] = time.monotonic()
        return "stopped early"
    return "ran to the end"


@handler("unit.cancel.deaf")
def deaf(payload: Any, ctx: JobContext) -> None:
    """A plain handler that never looks at ctx.cancelled."""
    seen["ctx"] = ctx
    _let_go.wait(30)
    seen["deaf_returned"] = True


@handler("unit.cancel.quick")
async def quick(payload: Any, ctx: JobContext) -> dict[str, int]:
    return {"answer": 42}


def _reset() -> None:
    seen.clear()
    _let_go.clear()


async def _running(store: FakeStore, job: uuid.UUID) -> None:
    await until(lambda: store.status(job) is Status.PROCESSING and "ctx" in seen, 5, "running")


async def test_a_cancelled_async_handler_is_cancelled_at_once_and_recorded_cancelled():
    _reset()
    store = FakeStore()
    job = store.add("unit.cancel.async")
    async with Stack(store, slots=1, job_timeout=60) as stack:
        await _running(store, job)
        store.request_cancel(job)
        asked = time.monotonic()
        assert stack.executor.cancel(job) is True
        await until(lambda: store.status(job) is Status.CANCELLED, 5, "cancelled")
        assert time.monotonic() - asked < 0.5
    assert seen["async_stopped"] is True  # ctx.cancelled was set before the task was cancelled
    assert "async_done" not in seen
    assert store.writes == [("cancel_attempt", 1)]
    assert stack.executor.abandoned == 0


async def test_a_plain_handler_that_polls_ctx_cancelled_returns_and_is_recorded_cancelled(caplog):
    _reset()
    store = FakeStore()
    job = store.add("unit.cancel.polls")
    async with Stack(store, slots=1, job_timeout=60, cancel_grace=5.0) as stack:
        await _running(store, job)
        store.request_cancel(job)
        asked = time.monotonic()
        stack.executor.cancel(job)
        await until(lambda: store.status(job) is Status.CANCELLED, 5, "cancelled")
        recorded = time.monotonic()
    # It returned on its own, well before the grace would have abandoned it.
    assert seen["sync_stopped"] - asked < 0.2 and recorded - asked < 0.5
    assert stack.executor.abandoned == 0
    assert not [r for r in caplog.records if "abandoned" in r.getMessage()]
    # What it returned once stopped is not a result: the attempt was cancelled.
    assert store.jobs[job].result is None
    assert store.writes == [("cancel_attempt", 1)]


async def test_a_plain_handler_that_ignores_the_cancel_is_abandoned_and_still_recorded_cancelled(
    caplog,
):
    _reset()
    store = FakeStore()
    job = store.add("unit.cancel.deaf")
    after = store.add("unit.cancel.quick")
    stack = Stack(store, slots=1, job_timeout=60, cancel_grace=5.0)
    try:
        async with stack:
            await _running(store, job)
            store.request_cancel(job)
            asked = time.monotonic()
            stack.executor.cancel(job)
            await until(lambda: store.status(job) is Status.CANCELLED, 5, "cancelled")
            # Recorded after CANCEL_GRACE, not after the longer cancel_grace of timeouts.
            assert CANCEL_GRACE <= time.monotonic() - asked < CANCEL_GRACE + 0.4
            assert seen["ctx"].cancelled.is_set()
            assert stack.executor.abandoned == 1
            # The slot moved on although the thread runs on.
            await until(lambda: store.status(after) is Status.COMPLETED, 5, "the next job")
            _let_go.set()
            await until(lambda: stack.executor.abandoned == 0, 5, "the thread to return")
    finally:
        _let_go.set()
    warned = [r for r in caplog.records if r.getMessage() == "handler thread abandoned"]
    assert [(r.job_id, r.reason) for r in warned] == [(str(job), "cancelled")]  # type: ignore[attr-defined]
    assert sorted(store.writes) == [("cancel_attempt", 1), ("complete", 1)]


async def test_a_cancel_after_the_outcome_settled_changes_nothing_the_outcome_stands():
    _reset()
    store = FakeStore()
    store.write_gate = asyncio.Event()  # the completion waits to be written
    job = store.add("unit.cancel.quick")
    async with Stack(store, slots=1) as stack:
        await until(
            lambda: stack.executor.running == 1 and _settled(stack), 5, "the outcome settled"
        )
        store.request_cancel(job)  # the job is still processing in the database
        assert stack.executor.cancel(job) is False
        store.write_gate.set()
        await until(lambda: store.status(job) is Status.COMPLETED, 5, "completed")
    assert store.jobs[job].result == '{"answer":42}'
    assert store.writes == [("complete", 1)]


def _settled(stack: Stack) -> bool:
    return all(attempt.settled for attempt in stack.executor._running)


async def test_a_cancel_for_a_job_this_process_does_not_hold_is_ignored():
    _reset()
    store = FakeStore()
    job = store.add("unit.cancel.async")
    async with Stack(store, slots=1, job_timeout=60) as stack:
        await _running(store, job)
        assert stack.executor.cancel(uuid.uuid4()) is False
        await asyncio.sleep(0.05)
        assert store.status(job) is Status.PROCESSING
        assert not seen["ctx"].cancelled.is_set()
        stack.executor.cancel(job)
        await until(lambda: store.status(job) is not Status.PROCESSING, 5, "stopped")


async def test_a_cancel_that_arrives_before_the_handler_starts_runs_no_handler():
    _reset()
    outcomes: list[Outcome] = []

    def record(outcome: Outcome, recorded: Recorded) -> None:
        outcomes.append(outcome)
        recorded(True)

    executor = Executor(record, slots={"default": 1}, job_timeout=5, backoff_base=1, backoff_max=1)
    job = Claimed(
        uuid.uuid4(), "unit.cancel.async", {}, 1, 3, 1, "default", None, None, 0, datetime.now(UTC)
    )
    executor.start(job, time.monotonic() + 60)
    assert executor.cancel(job.id) is True  # before the attempt's task first runs
    await until(lambda: outcomes, 5, "the outcome")
    assert [o.kind for o in outcomes] == [Operation.CANCEL_ATTEMPT]
    assert "ctx" not in seen  # the handler never ran
    await until(lambda: executor.running == 0, 5, "the slot freed")


async def test_a_renewal_that_reports_a_cancel_stops_the_attempt_when_the_notification_was_lost():
    _reset()
    store = FakeStore()
    job = store.add("unit.cancel.async")
    async with Stack(store, slots=1, job_timeout=60) as stack:
        await _running(store, job)
        store.request_cancel(job)  # announced to nobody
        assert await Heartbeat(store, stack.executor, 60).run_once() == 1
        await until(lambda: store.status(job) is Status.CANCELLED, 5, "cancelled")
    assert store.writes == [("cancel_attempt", 1)]


async def test_every_interruption_sets_ctx_cancelled_so_a_plain_handler_can_stop_on_a_timeout():
    _reset()
    store = FakeStore()
    job = store.add("unit.cancel.polls", max_attempts=3)
    async with Stack(store, slots=1, job_timeout=0.2, cancel_grace=5.0, backoff_base=30) as stack:
        await until(lambda: store.status(job) is Status.PENDING and store.writes, 5, "retried")
        assert stack.executor.abandoned == 0  # it returned when told, inside the grace
    assert "timed out after 0.2s" in (store.jobs[job].last_error or "")
    assert seen["ctx"].cancelled.is_set()


async def test_a_cancel_during_a_timeout_grace_records_the_cancel_not_a_retry(caplog):
    caplog.set_level(logging.INFO, logger="jobqueue.worker")
    _reset()
    store = FakeStore()
    job = store.add("unit.cancel.deaf", max_attempts=3)
    stack = Stack(store, slots=1, job_timeout=0.1, cancel_grace=5.0)
    try:
        async with stack:
            await until(lambda: seen.get("ctx") and seen["ctx"].cancelled.is_set(), 5, "timeout")
            store.request_cancel(job)
            assert stack.executor.cancel(job) is True
            assert stack.executor.cancel(job) is False  # once is enough
            _let_go.set()
            await until(lambda: store.status(job) is not Status.PROCESSING, 5, "recorded")
    finally:
        _let_go.set()
    assert store.status(job) is Status.CANCELLED
    assert store.writes == [("cancel_attempt", 1)]
    finished = [r for r in caplog.records if r.getMessage() == "job finished"]
    assert [r.outcome for r in finished] == ["cancelled"]  # type: ignore[attr-defined]


async def test_a_shutdown_release_of_a_job_whose_cancel_was_requested_ends_it_cancelled():
    """The store, not the executor, decides: a job given back must not run again once an
    operator cancelled it."""
    _reset()
    store = FakeStore()
    job = store.add("unit.cancel.async")
    stack = Stack(store, slots=1, job_timeout=60)
    async with stack:
        await _running(store, job)
        store.request_cancel(job)  # the announcement has not arrived yet
        await stack.shutdown(0.0)
    assert store.writes == [("release", 1)]
    assert store.status(job) is Status.CANCELLED
