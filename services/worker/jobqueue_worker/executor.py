"""The job slots of one worker process: each runs one attempt, decides its outcome, records it.

Each queue the process serves has a pool of slots of its own. An attempt runs in
a task of its own under the job's timeout (its own, else JOB_TIMEOUT): `async def` handlers
are awaited in it, plain `def` handlers run in a thread of their own that starts
at once (`jobqueue_worker.threads`), so the clock measures the handler alone. Whatever
a handler does (raise, time out, swallow cancellation, raise SystemExit), the
attempt ends in exactly one outcome, as `jobcore.states.next_operation` decides:
complete (with the handler's return value as the job's result, `jobqueue_worker.results`;
one that cannot be stored fails the attempt), fail (PermanentError), snooze (the handler
raised Snooze), retry_later with backoff, or dead_letter on the last attempt; release
when shutdown interrupts it, cancel_attempt when a cancel of the job was requested
(`cancel()`), unhandled when this process has no handler for the job's type (given back,
never failed: a rolling deploy may bring the code later). A failure is recorded with its
formatted traceback (`jobqueue_worker.failures`) and logged with it, at warning when the
job will run again and at error when it ended the job. The outcome goes to the completer,
and the slot is freed when the completer reports it written (or the lease lost), never
before. A cancel that arrives once the outcome is settled changes nothing: that outcome stands.

Timeout, shutdown, a lost lease and a cancel request interrupt an attempt: its
`ctx.cancelled` is set and an async handler's task is cancelled. Attempts whose
deadlines fall in the same tick (a thousandth of JOB_TIMEOUT, 10 ms at least)
share one timer, so a timeout comes at most that much late, never early. A handler
that swallows the cancellation keeps its task but not its slot: after
`cancel_grace` the attempt is recorded as interrupted and the task is left to
end on its own, its result ignored. A thread cannot be cancelled at all: its
handler has `cancel_grace` to see `ctx.cancelled` and return, then its attempt is
recorded without it and the thread runs on. Such abandoned handlers are counted
(`abandoned`, reported through `on_abandoned`; per type, `overruns`, which the limited
claims count against TYPE_CONCURRENCY, and per key, `key_overruns`, which the claims count
against KEY_CONCURRENCY) until they return; they never hold a slot.
For a cancel the grace is at most CANCEL_GRACE, so a cancelled job is recorded within a
second of its request even when its handler ignores it. The phases an attempt goes through
on these paths, and the only moves between them, are declared in `jobqueue_worker.attempt`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from typing import Any, cast
from uuid import UUID

from jobcore import logs
from jobcore.backoff import backoff
from jobcore.errors import JobqueueError, Snooze
from jobcore.registry import Handler, JobContext, get_handler
from jobcore.rows import Claimed, Lease
from jobcore.states import Operation, next_operation
from jobqueue_worker import metrics, tracing
from jobqueue_worker.attempt import BACK_IN_TASK, STOPPED_BY, Attempt, Interruption, Phase
from jobqueue_worker.completer import Outcome, Recorded
from jobqueue_worker.failures import error_text, traceback_text
from jobqueue_worker.results import ResultError, encode_result
from jobqueue_worker.threads import HandlerThreads

log = logging.getLogger("jobqueue.worker")

# A job of a type this process has no handler for is logged at most once a minute per type.
_UNHANDLED_LOG_EVERY = 60.0
# How a failure is logged, by the outcome it led to: it ended the job, or it runs again.
_FAILURE_LEVELS = {
    Operation.FAIL: logging.ERROR,
    Operation.DEAD_LETTER: logging.ERROR,
    Operation.RETRY_LATER: logging.WARNING,
}

# The longest a handler interrupted by a cancel request is waited for before its attempt is
# recorded without it: the record lands within a second of the request.
CANCEL_GRACE = 0.5
# Attempts whose JOB_TIMEOUT runs out within the same tick share one timer, which fires at
# the end of the tick. (A timer per attempt costs more than the rest of a short attempt's
# bookkeeping.) The tick grows with JOB_TIMEOUT so that at most ~1000 are pending.
_TICK_MIN = 0.01
_TICKS_PER_TIMEOUT = 1000


class JobTimeout(JobqueueError):
    """The attempt ran past JOB_TIMEOUT."""


class Executor:
    """Owns the job slots of one worker process: `slots[queue]` for each queue it serves, a
    separate pool per queue, so a flood of slow jobs in one queue never delays another."""

    def __init__(
        self,
        record: Callable[[Outcome, Recorded], None],
        *,
        slots: Mapping[str, int],
        job_timeout: float,
        backoff_base: float,
        backoff_max: float,
        webhook_allow_private: bool = False,
        on_slot_freed: Callable[[str], None] = lambda queue: None,
        on_abandoned: Callable[[int], None] = lambda n: None,
        on_overrun_ended: Callable[[Claimed], None] = lambda job: None,
        cancel_grace: float = 1.0,
        max_result_bytes: int = 65_536,
        clock: Callable[[], float] = time.monotonic,
        tracer: Any = None,
    ) -> None:
        self._record = record
        self._tracer = tracer  # from jobcore.tracing.start; None: tracing off
        self._max_result_bytes = max_result_bytes
        self.slots = dict(slots)
        self._busy = dict.fromkeys(self.slots, 0)
        self._job_timeout = job_timeout
        self._backoff_base = backoff_base
        self._backoff_max = backoff_max
        self._webhook_allow_private = webhook_allow_private
        self.on_slot_freed = on_slot_freed
        self.on_abandoned = on_abandoned
        self.on_overrun_ended = on_overrun_ended
        self.abandoned = 0
        # Abandoned handlers still running, by job type and by (queue, key): TYPE_CONCURRENCY
        # and KEY_CONCURRENCY count them.
        self._overruns: Counter[str] = Counter()
        self._key_overruns: Counter[tuple[str, str]] = Counter()
        self._cancel_grace = cancel_grace
        self._clock = clock
        self._running: set[Attempt] = set()
        # Type -> when (clock) this process last warned of having no handler for it.
        self._unhandled_warned: dict[str, float] = {}
        # Attempts in their handler, by the tick of their JOB_TIMEOUT deadline. A tick stays
        # until its timer fires, even when empty: attempts that finish without ever waiting
        # would otherwise make and cancel a timer each.
        self._tick = max(_TICK_MIN, job_timeout / _TICKS_PER_TIMEOUT)
        self._deadlines: dict[int, set[Attempt]] = {}
        self._all_freed: asyncio.Future[None] | None = None
        self._shutting_down = False
        self._threads = HandlerThreads(
            keep=sum(self.slots.values()), late_return=self._thread_returned
        )

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def free(self) -> dict[str, int]:
        """Free slots per queue."""
        return {queue: n - self._busy[queue] for queue, n in self.slots.items()}

    def running_jobs(self) -> list[tuple[str, bool]]:
        """(job id, whether its handler is what the loop is running right now) per attempt.

        For another thread while the loop is blocked; RuntimeError if the loop changed
        the set meanwhile."""
        found = []
        for attempt in list(self._running):
            task = attempt.task
            coro = task.get_coro() if task is not None else None
            found.append((str(attempt.job.id), bool(getattr(coro, "cr_running", False))))
        return found

    def overruns(self) -> dict[str, int]:
        """Per job type, the handlers still running after their attempts were recorded
        without them (abandoned): each still holds what its type's TYPE_CONCURRENCY counts."""
        return {job_type: n for job_type, n in self._overruns.items() if n > 0}

    def key_overruns(self) -> dict[tuple[str, str], int]:
        """The same per (queue, concurrency key), for the jobs that have one: each still
        holds what its key's KEY_CONCURRENCY counts."""
        return {key: n for key, n in self._key_overruns.items() if n > 0}

    def leases(self) -> list[tuple[Lease, float]]:
        """The lease of every job in a slot, with when it runs out (monotonic), for the
        heartbeat to renew."""
        return [(attempt.job.lease, attempt.lease_deadline) for attempt in self._running]

    def renewed(self, leases: Collection[Lease], deadline: float) -> None:
        """These leases now run out at `deadline` (monotonic)."""
        for attempt in self._running:
            if attempt.job.lease in leases:
                attempt.lease_deadline = max(attempt.lease_deadline, deadline)

    def lease_lost(self, lease: Lease) -> bool:
        """Another claim may own the job now: stop the attempt, and write nothing for it.
        False if no attempt under this lease was still running."""
        for attempt in list(self._running):
            if attempt.job.lease != lease or attempt.settled:
                continue
            if attempt.phase is Phase.CLAIMED:
                attempt.move(Phase.CLAIMED, Interruption.LEASE_LOST)
            else:
                self._interrupt(attempt, Interruption.LEASE_LOST)
            return True
        return False

    def cancel(self, job_id: UUID, via: str = "notification") -> bool:
        """A cancel of the job was requested (`via` a notification or a renewal): stop its
        attempt if this process runs it and its outcome is not settled yet. False if there
        is nothing to stop (not ours, settled already, or being stopped for this already)."""
        for attempt in list(self._running):
            if attempt.job.id != job_id or attempt.settled:
                continue
            if attempt.interrupted in (Interruption.CANCELLED, Interruption.LEASE_LOST):
                return False  # stopping already; a lost lease writes nothing anyway
            log.info(
                "cancel requested, stopping the attempt",
                extra={**attempt.fields.values, "via": via},
            )
            if attempt.phase is Phase.CLAIMED or attempt.interrupted is not None:
                # Before the handler starts, or while a timeout or shutdown stops it already:
                # noted, and recorded as what was asked.
                attempt.move(attempt.phase, Interruption.CANCELLED)
            else:
                self._interrupt(attempt, Interruption.CANCELLED)
            return True
        return False

    def start(self, job: Claimed, lease_deadline: float) -> None:
        """Run `job` in a free slot; `lease_deadline` is when its lease runs out (monotonic)."""
        if self._busy.get(job.queue, 0) >= self.slots.get(job.queue, 0):
            raise RuntimeError(f"no free job slot in queue {job.queue!r}")
        attempt = Attempt(job, lease_deadline)
        self._running.add(attempt)
        self._busy[job.queue] += 1
        logs.line(log, "job started", attempt.fields)
        if self._tracer is None:
            attempt.task = asyncio.get_running_loop().create_task(self._run(attempt))
            return
        # The task inherits the span as its current one: a handler's own spans nest in it.
        attempt.span = tracing.begin(self._tracer, job)
        token = tracing.entered(attempt.span)
        try:
            attempt.task = asyncio.get_running_loop().create_task(self._run(attempt))
        finally:
            tracing.left(token)

    async def shutdown(self, shutdown_timeout: float) -> None:
        """Give running attempts `shutdown_timeout` seconds to finish, then interrupt and
        release them."""
        await self._until_all_freed(shutdown_timeout)
        if self._running:
            log.info("interrupting running jobs", extra={"running": len(self._running)})
            self._shutting_down = True
            for attempt in list(self._running):
                self._interrupt(attempt, Interruption.SHUTDOWN)
            # Bounded: cancel_grace, then the release write (retried only while the lease holds).
            await self._until_all_freed(None)
        # Threads of plain handlers that ignore the end of their attempt are not waited for.
        self._threads.close()

    async def _until_all_freed(self, seconds: float | None) -> None:
        """Wait until no slot is busy (jobs claimed meanwhile included), at most `seconds`."""
        loop = asyncio.get_running_loop()
        deadline = None if seconds is None else loop.time() + seconds
        while self._running:
            if self._all_freed is None or self._all_freed.done():
                self._all_freed = loop.create_future()
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await asyncio.shield(self._all_freed)

    async def _run(self, attempt: Attempt) -> None:
        try:
            await self._attempt(attempt)
        except BaseException:
            # A fault of ours, not the handler's: free the slot; the lease runs out and
            # recovery takes the job back.
            log.exception("job slot failed", extra=attempt.fields.values)
            if not attempt.settled:
                attempt.settle()
                if attempt.span is not None:
                    tracing.end(attempt.span, "slot_failed", applied=False, error="job slot failed")
                self._free(attempt)

    async def _attempt(self, attempt: Attempt) -> None:
        job = attempt.job
        if attempt.interrupted is Interruption.CANCELLED:
            self._settle(attempt, Operation.CANCEL_ATTEMPT)
            return
        if self._shutting_down:
            self._settle(attempt, Operation.RELEASE, "interrupted by shutdown")
            return
        # Or the claim was answered after the lease it took ran out (its commit waited, on a
        # synchronous standby that was away, say): by this process's clock, as the heartbeat
        # judges, the job may be taken back and run elsewhere at any moment.
        ran_out = self._clock() >= attempt.lease_deadline
        if attempt.interrupted is Interruption.LEASE_LOST or ran_out:
            self._drop(attempt)
            return
        handler = get_handler(job.type)
        if handler is None:
            self._unhandled(attempt)
            return
        ctx = JobContext(
            job_id=job.id,
            type=job.type,
            attempt=job.attempts,
            max_attempts=job.max_attempts,
            lease_token=job.lease_token,
            webhook_allow_private=self._webhook_allow_private,
        )
        attempt.ctx = ctx
        # Lines the handler logs carry the job's fields.
        logs.bind_task(**attempt.fields.values)
        loop = asyncio.get_running_loop()
        task = attempt.task
        assert task is not None
        attempt.started = self._clock()
        tick = math.ceil((loop.time() + self._timeout(job)) / self._tick)
        due = self._deadlines.get(tick)
        if due is None:
            due = self._deadlines[tick] = set()
            loop.call_at(tick * self._tick, self._time_out, tick)
        due.add(attempt)
        attempt.move(Phase.IN_HANDLER)
        failure: BaseException | None = None
        value: Any = None
        try:
            if _is_async(handler):
                value = await handler(job.payload, ctx)
            else:
                value = await self._in_thread(attempt, handler, job.payload, ctx)
        except BaseException as exc:
            # A handler must never take the worker process down. A CancelledError is ours if
            # interrupted; else from inside the handler (it cancelled itself, or a thread's
            # future), a retryable error like any other.
            failure = exc
        finally:
            due.discard(attempt)
            if attempt.timer is not None:
                attempt.timer.cancel()
            # A cancellation consumed here must not hit the rest of the task.
            while task.cancelling():
                task.uncancel()
        if attempt.phase in (Phase.DETACHED, Phase.OVERRUN):
            # Abandoned after ignoring its interruption, and recorded without it: over at last.
            self._abandoned_returned(attempt)
            return
        if attempt.phase is not Phase.ABANDONED:  # else a thread left to run on
            attempt.move(Phase.ENDED)
        attempt.duration = self._clock() - attempt.started
        if attempt.interrupted is not None:
            # An async handler's cancellation shows where it was stopped; a thread's shows
            # only the executor waiting for it.
            self._settle_interrupted(attempt, failure if _is_async(handler) else None)
        elif failure is not None:
            self._settle_failure(attempt, failure)
        elif value is None:  # most handlers: nothing to encode
            self._settle(attempt, Operation.COMPLETE)
        else:
            self._settle_result(attempt, value)

    def _settle_result(self, attempt: Attempt, value: Any) -> None:
        try:
            result = encode_result(value, self._max_result_bytes)
        except ResultError as exc:
            # Not retried: the same handler would return the same value again.
            error = error_text(exc, named=False)
            self._settle(attempt, Operation.FAIL, error, traceback=traceback_text(exc))
            return
        attempt.result = result
        self._settle(attempt, Operation.COMPLETE)

    async def _in_thread(
        self, attempt: Attempt, handler: Handler, payload: Any, ctx: JobContext
    ) -> Any:
        # Copy the context so lines a threaded handler logs carry the job's fields.
        run = functools.partial(contextvars.copy_context().run, handler, payload, ctx)
        attempt.move(Phase.IN_THREAD)
        future = self._threads.submit(run, attempt)
        try:
            result = await future
        except asyncio.CancelledError:
            if future.cancelled():  # interrupted while the thread runs: it cannot be stopped
                self._abandoned(attempt, "handler thread abandoned", reason=attempt.interrupted)
            raise
        if inspect.isawaitable(result):
            attempt.move(BACK_IN_TASK[attempt.phase])  # what it returned can be cancelled
            return await result
        return result

    def _thread_returned(self, key: object) -> None:
        self._abandoned_returned(cast(Attempt, key))

    def _abandoned_returned(self, attempt: Attempt) -> None:
        attempt.returned_late()
        self._count_abandoned(attempt, -1)
        log.info(
            "abandoned handler returned",
            extra={
                **attempt.fields.values,
                "ran_for": round(self._clock() - attempt.started, 3),
                "abandoned_handlers": self.abandoned,
            },
        )

    def _abandoned(self, attempt: Attempt, message: str, **extra: Any) -> None:
        attempt.move(Phase.ABANDONED)
        self._count_abandoned(attempt, +1)
        log.warning(
            message, extra={**attempt.fields.values, **extra, "abandoned_handlers": self.abandoned}
        )

    def _count_abandoned(self, attempt: Attempt, change: int) -> None:
        self.abandoned += change
        self._overruns[attempt.job.type] += change
        job = attempt.job
        if job.concurrency_key is not None:
            self._key_overruns[job.queue, job.concurrency_key] += change
        self.on_abandoned(self.abandoned)
        if change < 0:
            self.on_overrun_ended(job)

    def _time_out(self, tick: int) -> None:
        for attempt in list(self._deadlines.pop(tick, ())):
            self._interrupt(attempt, Interruption.TIMEOUT)

    def _interrupt(self, attempt: Attempt, reason: Interruption) -> None:
        """Tell the attempt's handler to stop (`ctx.cancelled`; an async one is cancelled too);
        it has cancel_grace to stop before its slot moves on."""
        stopping = STOPPED_BY.get(attempt.phase)
        if stopping is None:
            return  # not started, stopping already, or over
        assert attempt.task is not None and attempt.ctx is not None
        attempt.move(stopping, reason)
        attempt.ctx.stop()
        if stopping is Phase.INTERRUPTED:
            attempt.task.cancel()
        grace = self._cancel_grace
        if reason is Interruption.CANCELLED:
            grace = min(grace, CANCEL_GRACE)
        attempt.timer = asyncio.get_running_loop().call_later(grace, self._abandon, attempt)

    def _abandon(self, attempt: Attempt) -> None:
        if attempt.phase is Phase.INTERRUPTED_THREAD:
            # Stop waiting for the thread: the attempt's task counts it abandoned and settles.
            assert attempt.task is not None
            attempt.task.cancel()
        elif attempt.phase is Phase.INTERRUPTED:
            # A handler that swallows cancellation keeps running, but its slot moves on.
            self._abandoned(attempt, "handler did not stop when cancelled")
            attempt.duration = self._clock() - attempt.started
            self._settle_interrupted(attempt)

    def _unhandled(self, attempt: Attempt) -> None:
        """No handler for the job's type in this process: the job is given back to wait for
        a worker that has one (the type may be new, and this worker of an older release)."""
        job_type = attempt.job.type
        now = self._clock()
        last = self._unhandled_warned.get(job_type)
        if last is None or now - last >= _UNHANDLED_LOG_EVERY:
            if len(self._unhandled_warned) >= 1000:  # types come from submitters: bounded
                self._unhandled_warned.clear()
            self._unhandled_warned[job_type] = now
            log.warning(
                "no handler for this job type in this worker, giving its jobs back",
                extra={**attempt.fields.values, "every_seconds": _UNHANDLED_LOG_EVERY},
            )
        error = f"no handler for type {job_type!r} in this worker"
        self._settle(attempt, Operation.UNHANDLED, error)

    def _settle_interrupted(self, attempt: Attempt, failure: BaseException | None = None) -> None:
        """`failure`: what the handler raised when it stopped, if it did (an async handler's
        cancellation): for a timeout, its traceback shows where the handler was."""
        if attempt.interrupted is Interruption.LEASE_LOST:
            self._drop(attempt)
        elif attempt.interrupted is Interruption.CANCELLED:
            self._settle(attempt, Operation.CANCEL_ATTEMPT)
        elif attempt.interrupted is Interruption.SHUTDOWN:
            self._settle(attempt, Operation.RELEASE, "interrupted by shutdown")
        else:
            timeout = self._timeout(attempt.job)
            self._settle_failure(attempt, JobTimeout(f"timed out after {timeout:g}s"), failure)

    def _timeout(self, job: Claimed) -> float:
        """The job's own timeout, else JOB_TIMEOUT."""
        return job.timeout if job.timeout is not None else self._job_timeout

    def _settle_failure(
        self, attempt: Attempt, failure: BaseException, raised: BaseException | None = None
    ) -> None:
        """`raised`: the exception whose traceback goes with `failure` when that was not
        raised itself (a timeout); by default `failure`'s own. None for a timeout: none."""
        job = attempt.job
        operation = next_operation(failure, job.attempts, job.max_attempts)
        if isinstance(failure, Snooze):
            self._settle(attempt, operation, None, failure.seconds)
            return
        delay = 0.0
        if operation is Operation.RETRY_LATER:
            delay = backoff(job.attempts, self._backoff_base, self._backoff_max)
        if raised is None and failure.__traceback__ is not None:
            raised = failure
        traceback = traceback_text(raised) if raised is not None else None
        self._settle(attempt, operation, error_text(failure), delay, traceback)

    def _settle(
        self,
        attempt: Attempt,
        kind: Operation,
        error: str | None = None,
        delay: float = 0.0,
        traceback: str | None = None,
    ) -> None:
        """Hand the outcome to the completer; the slot is freed once it is written."""
        attempt.settle()
        attempt.kind, attempt.error, attempt.delay = kind, error, delay
        attempt.traceback = traceback
        job = attempt.job
        outcome = Outcome(
            kind, job.lease, job.queue, attempt.deadline, error, delay, attempt.result, traceback
        )
        self._record(outcome, functools.partial(self._recorded, attempt))

    def _drop(self, attempt: Attempt) -> None:
        """End an attempt whose lease was lost without writing an outcome: the job is
        someone else's now (or recovery's), and a write could only be rejected."""
        attempt.settle()
        log.warning("lease lost, attempt stopped", extra=attempt.fields.values)
        metrics.lease_lost(1)
        if attempt.span is not None:
            tracing.end(attempt.span, "lease_lost", applied=False)
        self._free(attempt)

    def _recorded(self, attempt: Attempt, applied: bool) -> None:
        kind = attempt.kind
        metrics.attempt_finished(kind, applied, attempt.duration)
        if kind is Operation.UNHANDLED and applied:
            metrics.job_unhandled(attempt.job.type)
        # An unhandled job's delay is the statement's, which the worker does not see.
        known_delay = kind.due_again and not kind.delay_grows
        finished: dict[str, Any] = {
            "outcome": kind.outcome,
            "duration_ms": round(attempt.duration * 1000, 3),
            "error": attempt.error,
            "retry_in": round(attempt.delay, 3) if known_delay else None,
        }
        if attempt.traceback is not None:
            finished["exc"] = attempt.traceback
        level = _FAILURE_LEVELS.get(kind, logging.INFO) if applied else logging.INFO
        logs.line(log, "job finished", attempt.fields, finished, level=level)
        if attempt.span is not None:
            tracing.end(attempt.span, kind.outcome, applied=applied, error=attempt.error)
        self._free(attempt)

    def _free(self, attempt: Attempt) -> None:
        attempt.free()
        self._running.discard(attempt)
        self._busy[attempt.job.queue] -= 1
        if not self._running and self._all_freed is not None and not self._all_freed.done():
            self._all_freed.set_result(None)
        self.on_slot_freed(attempt.job.queue)


@functools.lru_cache(maxsize=1024)
def _is_async(handler: Handler) -> bool:
    return inspect.iscoroutinefunction(handler)
