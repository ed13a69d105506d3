"""The attempt's lifecycle (`jobqueue_worker.attempt`): the declared moves are the only ones
accepted, and each of the executor's real paths walks the phases it should."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from jobcore import JobContext, PermanentError, handler
from jobcore.rows import Claimed
from jobcore.states import Operation, Status
from jobqueue_worker.attempt import MOVES, REPLACES, Attempt, Interruption, LifecycleError, Phase
from jobqueue_worker.completer import Outcome, Recorded
from jobqueue_worker.executor import Executor
from tests.worker.fakestore import FakeStore
from tests.worker.stack import Stack
from tests.worker.support import until

P = Phase
_STOPPING = {P.INTERRUPTED, P.INTERRUPTED_THREAD}
# Lets the handlers below that ignore their interruption return, once a test says so. They
# return after _DEAF seconds anyway, so that a test that fails cannot hang on them.
_let_go = threading.Event()
_DEAF = 5.0


def _attempt(phase: Phase = P.CLAIMED, interrupted: Interruption | None = None) -> Attempt:
    job = Claimed(uuid.uuid4(), "t", {}, 1, 3, 1, "default", None, None, 0, datetime.now(UTC))
    attempt = Attempt(job, 0.0)
    attempt.phase, attempt.interrupted = phase, interrupted
    return attempt


# The table on its own.


def _reachable(start: Phase) -> set[Phase]:
    reached, frontier = {start}, [start]
    while frontier:
        for to in MOVES[frontier.pop()] - reached:
            reached.add(to)
            frontier.append(to)
    return reached


def test_interruptions_keep_the_words_the_log_lines_always_had():
    assert [str(reason) for reason in Interruption] == [
        "timeout",
        "shutdown",
        "lease lost",
        "cancelled",
    ]


@pytest.mark.parametrize(
    ("start", "to"),
    [(start, to) for start, moves in MOVES.items() for to in sorted(moves, key=str)],
)
def test_every_declared_move_is_accepted(start, to):
    # Stopping needs a reason: give the one a real interruption would have.
    attempt = _attempt(start, Interruption.TIMEOUT if start in _STOPPING else None)
    reason = Interruption.CANCELLED if to in _STOPPING or to is start else None
    attempt.move(to, reason)
    assert attempt.phase is to
    assert attempt.settled is (to in {P.SETTLED, P.DETACHED, P.OVERRUN, P.FREED})


@pytest.mark.parametrize(
    ("start", "to"),
    [(start, to) for start, to in itertools.product(Phase, Phase) if to not in MOVES[start]],
)
def test_every_undeclared_move_raises_naming_both_phases(start, to):
    attempt = _attempt(start, Interruption.TIMEOUT)
    with pytest.raises(LifecycleError, match=f"from {start} to {to}"):
        attempt.move(to, Interruption.CANCELLED)
    assert attempt.phase is start and attempt.interrupted is Interruption.TIMEOUT


def test_every_phase_is_reachable_and_every_attempt_can_end_freed():
    assert _reachable(P.CLAIMED) == set(Phase)
    assert [phase for phase in Phase if P.FREED not in _reachable(phase)] == []
    assert MOVES[P.FREED] == frozenset()


@pytest.mark.parametrize(
    ("current", "new"), [(current, new) for current in REPLACES for new in Interruption]
)
def test_an_interruption_replaces_another_only_as_declared(current, new):
    attempt = _attempt(P.INTERRUPTED if current else P.IN_HANDLER, current)
    if new in REPLACES[current]:
        attempt.move(P.INTERRUPTED, new)
        assert attempt.interrupted is new
    else:
        with pytest.raises(LifecycleError, match=f"{new!r} cannot replace {current!r}"):
            attempt.move(P.INTERRUPTED, new)
        assert attempt.interrupted is current


@pytest.mark.parametrize("to", sorted(_STOPPING, key=str))
def test_an_attempt_cannot_be_stopped_without_a_reason(to):
    attempt = _attempt(P.IN_THREAD if to is P.INTERRUPTED_THREAD else P.IN_HANDLER)
    with pytest.raises(LifecycleError, match="without a reason"):
        attempt.move(to)
    assert attempt.phase is not to


# The executor's real paths, each attempt's moves recorded as they are made.

Walk = list[Phase | Interruption]


@pytest.fixture
def moves(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[uuid.UUID, Walk]]:
    """By job id, the phases its attempt went to in order, each interruption right after
    the move that gave it."""
    walks: dict[uuid.UUID, Walk] = defaultdict(list)
    real = Attempt.move

    def move(self: Attempt, to: Phase, reason: Interruption | None = None) -> None:
        real(self, to, reason)  # an undeclared move raises before it is recorded
        walks[self.job.id] += [to] if reason is None else [to, reason]

    monkeypatch.setattr(Attempt, "move", move)
    _let_go.clear()
    try:
        yield walks
    finally:
        _let_go.set()


@handler("unit.attempt.ok")
async def ok(payload: Any, ctx: JobContext) -> Any:
    return payload.get("value")


@handler("unit.attempt.permanent")
async def permanent(payload: Any, ctx: JobContext) -> None:
    raise PermanentError("bad input")


@handler("unit.attempt.sleeps")
async def sleeps(payload: Any, ctx: JobContext) -> None:
    await asyncio.sleep(30)


@handler("unit.attempt.polls")
def polls(payload: Any, ctx: JobContext) -> None:
    """A plain handler that returns once told to stop."""
    ctx.cancelled.wait(30)


@handler("unit.attempt.blocks")
def blocks(payload: Any, ctx: JobContext) -> None:
    """A plain handler deaf to ctx.cancelled, until the test lets it go."""
    _let_go.wait(_DEAF)


@handler("unit.attempt.deaf")
async def deaf(payload: Any, ctx: JobContext) -> None:
    """Swallows every cancellation until the test lets it go."""
    deadline = time.monotonic() + _DEAF
    while not _let_go.is_set() and time.monotonic() < deadline:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.01)


@handler("unit.attempt.hands-back")
def hands_back(payload: Any, ctx: JobContext) -> Any:
    """A plain handler whose work goes on in the loop: it returns a coroutine."""
    return ok({"value": 7}, ctx)


@contextlib.asynccontextmanager
async def _running(store: FakeStore, **stack: Any) -> AsyncIterator[Stack]:
    async with Stack(store, **stack) as running:
        try:
            yield running
        finally:
            # Let go what a failed test left waiting: the stack's shutdown would wait for it.
            _let_go.set()
            if store.write_gate is not None:
                store.write_gate.set()


_FINISHED = [P.ENDED, P.SETTLED, P.FREED]
_TIMEOUT, _CANCELLED = Interruption.TIMEOUT, Interruption.CANCELLED


async def test_complete_fail_and_no_handler_walk_the_short_paths(moves):
    store = FakeStore()
    done = store.add("unit.attempt.ok", {"value": 1})
    failed = store.add("unit.attempt.permanent")
    threaded = store.add("unit.attempt.polls", max_attempts=1)
    unknown = store.add("unit.attempt.no-such-type")
    async with _running(store, slots=4, job_timeout=0.1):
        await until(
            lambda: len(moves) == 4 and all(m[-1] is P.FREED for m in moves.values()), 5, "freed"
        )
    assert [store.status(j) for j in (done, failed, threaded, unknown)] == [
        *(Status.COMPLETED, Status.FAILED, Status.DEAD_LETTER, Status.PENDING)
    ]  # a job without a handler is given back
    assert moves[done] == moves[failed] == [P.IN_HANDLER, *_FINISHED]
    # It heeded its timeout.
    assert moves[threaded] == [
        *(P.IN_HANDLER, P.IN_THREAD, P.INTERRUPTED_THREAD, _TIMEOUT, *_FINISHED)
    ]
    assert moves[unknown] == [P.SETTLED, P.FREED]


async def test_a_thread_that_returns_a_coroutine_goes_back_to_the_task(moves):
    store = FakeStore()
    job = store.add("unit.attempt.hands-back")
    async with _running(store, slots=1):
        await until(lambda: P.FREED in moves[job], 5, "freed")
    assert moves[job] == [P.IN_HANDLER, P.IN_THREAD, P.IN_HANDLER, *_FINISHED]
    assert store.jobs[job].result == "7"


@pytest.mark.parametrize("reason", list(Interruption))
async def test_an_async_handler_that_stops_when_interrupted(moves, reason):
    store = FakeStore()
    job = store.add("unit.attempt.sleeps", max_attempts=3)
    timeout = 0.1 if reason is Interruption.TIMEOUT else 60
    async with _running(store, slots=1, job_timeout=timeout, backoff_base=30) as stack:
        # (a 0.1 s timeout may have struck already by the first look: it is the first move)
        await until(lambda: moves[job][:1] == [P.IN_HANDLER], 5, "the handler running")
        if reason is Interruption.CANCELLED:
            store.request_cancel(job)
            assert stack.executor.cancel(job) is True
        elif reason is Interruption.SHUTDOWN:
            await stack.shutdown(0.0)
        elif reason is Interruption.LEASE_LOST:
            ((lease, _),) = stack.executor.leases()
            assert stack.executor.lease_lost(lease) is True
        await until(lambda: P.FREED in moves[job], 5, "the slot freed")
    assert moves[job] == [P.IN_HANDLER, P.INTERRUPTED, reason, *_FINISHED]
    written = {
        Interruption.TIMEOUT: [("retry_later", 1)],
        Interruption.CANCELLED: [("cancel_attempt", 1)],
        Interruption.SHUTDOWN: [("release", 1)],
        Interruption.LEASE_LOST: [],
    }
    assert store.writes == written[reason]


async def test_a_cancel_during_a_timeout_replaces_its_reason_in_place(moves):
    store = FakeStore()
    job = store.add("unit.attempt.blocks")
    async with _running(store, slots=1, job_timeout=0.1, cancel_grace=5.0) as stack:
        await until(lambda: P.INTERRUPTED_THREAD in moves[job], 5, "the timeout")
        store.request_cancel(job)
        assert stack.executor.cancel(job) is True
        _let_go.set()
        await until(lambda: P.FREED in moves[job], 5, "the slot freed")
    assert moves[job] == [
        *(P.IN_HANDLER, P.IN_THREAD, P.INTERRUPTED_THREAD, _TIMEOUT),
        *(P.INTERRUPTED_THREAD, _CANCELLED, *_FINISHED),
    ]
    assert store.writes == [("cancel_attempt", 1)]


async def test_a_thread_that_ignores_its_timeout_is_abandoned_then_returns(moves):
    store = FakeStore()
    job = store.add("unit.attempt.blocks", max_attempts=3)
    async with _running(
        store, slots=1, job_timeout=0.1, cancel_grace=0.1, backoff_base=30
    ) as stack:
        await until(lambda: P.OVERRUN in moves[job], 5, "the slot freed")
        assert stack.executor.overruns() == {"unit.attempt.blocks": 1}
        _let_go.set()
        await until(lambda: P.FREED in moves[job], 5, "the thread to return")
        assert stack.executor.abandoned == 0
    assert moves[job] == [
        *(P.IN_HANDLER, P.IN_THREAD, P.INTERRUPTED_THREAD, _TIMEOUT, P.ABANDONED),
        *(P.DETACHED, P.OVERRUN, P.FREED),
    ]
    assert store.writes == [("retry_later", 1)]


@pytest.mark.parametrize("returns", ["after the write", "before the write"])
async def test_an_async_handler_swallowing_its_cancellation_is_abandoned_then_returns(
    moves, returns
):
    store = FakeStore()
    store.write_gate = asyncio.Event()
    job = store.add("unit.attempt.deaf", max_attempts=3)
    async with _running(
        store, slots=1, job_timeout=0.1, cancel_grace=0.1, backoff_base=30
    ) as stack:
        await until(lambda: P.DETACHED in moves[job], 5, "recorded without its handler")
        assert stack.executor.abandoned == 1
        if returns == "after the write":
            store.write_gate.set()
            await until(lambda: P.OVERRUN in moves[job], 5, "the slot freed")
            _let_go.set()
        else:
            _let_go.set()
            await until(lambda: P.SETTLED in moves[job], 5, "the handler to return")
            store.write_gate.set()
        await until(lambda: P.FREED in moves[job], 5, "over")
        assert stack.executor.abandoned == 0
    late = [P.OVERRUN, P.FREED] if returns == "after the write" else [P.SETTLED, P.FREED]
    assert moves[job] == [P.IN_HANDLER, P.INTERRUPTED, _TIMEOUT, P.ABANDONED, P.DETACHED, *late]
    assert store.writes == [("retry_later", 1)]


@pytest.mark.parametrize("reason", [Interruption.CANCELLED, Interruption.LEASE_LOST])
async def test_an_interruption_before_the_handler_starts_runs_no_handler(moves, reason):
    outcomes: list[Outcome] = []

    def record(outcome: Outcome, recorded: Recorded) -> None:
        outcomes.append(outcome)
        recorded(True)

    executor = Executor(record, slots={"default": 1}, job_timeout=5, backoff_base=1, backoff_max=1)
    job = Claimed(
        uuid.uuid4(), "unit.attempt.ok", {}, 1, 3, 1, "default", None, None, 0, datetime.now(UTC)
    )
    executor.start(job, time.monotonic() + 60)  # its task has not run yet
    if reason is Interruption.CANCELLED:
        assert executor.cancel(job.id) is True
    else:
        assert executor.lease_lost(job.lease) is True
    await until(lambda: executor.running == 0, 5, "the slot freed")
    assert moves[job.id] == [P.CLAIMED, reason, P.SETTLED, P.FREED]
    kinds = [Operation.CANCEL_ATTEMPT] if reason is Interruption.CANCELLED else []
    assert [o.kind for o in outcomes] == kinds
