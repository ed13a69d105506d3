"""The job slots of one worker process: each runs one attempt, decides its outcome, records it.

An attempt runs under JOB_TIMEOUT; `async def` handlers are awaited in their
own task, plain `def` handlers run in a bounded thread pool. Whatever a handler
does (raise, time out, swallow cancellation, raise SystemExit), the attempt ends
in exactly one outcome: complete, fail (PermanentError, unknown type),
retry_later with backoff, or dead_letter on the last attempt; release when
shutdown interrupts it. A slot is freed only after its outcome was recorded.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jobcore.backoff import backoff
from jobcore.errors import PermanentError
from jobcore.logs import bind
from jobcore.registry import Handler, JobContext, get_handler
from jobcore.store import Claimed
from jobqueue_worker import metrics
from jobqueue_worker.completer import Outcome
from jobqueue_worker.database import describe

log = logging.getLogger("jobqueue.worker")

# last_error is TEXT: PostgreSQL rejects NUL characters, and a huge message helps nobody.
_MAX_ERROR = 2000


class JobTimeout(Exception):
    """The attempt ran past JOB_TIMEOUT."""


class Executor:
    """Owns the `slots` job slots of one worker process."""

    def __init__(
        self,
        record: Callable[[Outcome], Awaitable[bool]],
        *,
        slots: int,
        job_timeout: float,
        backoff_base: float,
        backoff_max: float,
        webhook_allow_private: bool = False,
        on_slot_freed: Callable[[], None] = lambda: None,
        cancel_grace: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._record = record
        self.slots = slots
        self._job_timeout = job_timeout
        self._backoff_base = backoff_base
        self._backoff_max = backoff_max
        self._webhook_allow_private = webhook_allow_private
        self.on_slot_freed = on_slot_freed
        self._cancel_grace = cancel_grace
        self._clock = clock
        # A running attempt and the future that interrupts it at shutdown.
        self._running: dict[asyncio.Task[None], asyncio.Future[None]] = {}
        self._threads = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="handler")

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def free(self) -> int:
        return self.slots - len(self._running)

    def start(self, job: Claimed, lease_deadline: float) -> None:
        """Run `job` in a free slot; `lease_deadline` is when its lease runs out (monotonic)."""
        if self.free <= 0:
            raise RuntimeError("no free job slot")
        interrupt: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._execute(job, lease_deadline, interrupt))
        self._running[task] = interrupt
        task.add_done_callback(self._slot_done)

    def _slot_done(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("job slot failed", exc_info=task.exception())
        self.on_slot_freed()

    async def shutdown(self, shutdown_timeout: float) -> None:
        """Give running attempts `shutdown_timeout` seconds to finish, then interrupt and
        release them."""
        if self._running:
            await asyncio.wait(list(self._running), timeout=shutdown_timeout)
        if self._running:
            log.info("interrupting running jobs", extra={"running": len(self._running)})
            for interrupt in self._running.values():
                if not interrupt.done():
                    interrupt.set_result(None)
            # Bounded: cancel_grace, then the release write (retried only while the lease holds).
            await asyncio.wait(list(self._running))
        # Threads of plain handlers that ignore the end of their attempt are not waited for.
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def _execute(
        self, job: Claimed, deadline: float, interrupt: asyncio.Future[None]
    ) -> None:
        with bind(
            job_id=str(job.id), job_type=job.type, attempt=job.attempts, lease_token=job.lease_token
        ):
            log.info("job started")
            started = self._clock()
            kind, error, delay = await self._attempt(job, interrupt)
            duration = self._clock() - started
            applied = await self._record(Outcome(kind, job.lease, deadline, error, delay))
            metrics.attempt_finished(kind, applied, duration)
            log.info(
                "job finished",
                extra={
                    "outcome": metrics.OUTCOMES[kind],
                    "duration_ms": round(duration * 1000, 3),
                    "error": error,
                    "retry_in": round(delay, 3) if kind == "retry_later" else None,
                },
            )

    async def _attempt(
        self, job: Claimed, interrupt: asyncio.Future[None]
    ) -> tuple[str, str | None, float]:
        """Run the handler; return (outcome kind, error, retry delay)."""
        handler = get_handler(job.type)
        if handler is None:
            return "fail", f"no handler is registered for job type {job.type!r}", 0.0
        ctx = JobContext(
            job_id=job.id,
            type=job.type,
            attempt=job.attempts,
            max_attempts=job.max_attempts,
            lease_token=job.lease_token,
            webhook_allow_private=self._webhook_allow_private,
        )
        call = asyncio.create_task(self._call(handler, job.payload, ctx))
        waiting: set[asyncio.Future[Any]] = {call, interrupt}
        done, _ = await asyncio.wait(
            waiting, timeout=self._job_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        failure: BaseException | None
        if call in done:
            failure = asyncio.CancelledError() if call.cancelled() else call.result()
            if failure is None:
                return "complete", None, 0.0
        else:
            await self._stop(call)
            if interrupt.done():
                return "release", "interrupted by shutdown", 0.0
            failure = JobTimeout(f"timed out after {self._job_timeout:g}s")
        error = _error_text(failure)
        if isinstance(failure, PermanentError):
            return "fail", error, 0.0
        if job.attempts >= job.max_attempts:
            return "dead_letter", error, 0.0
        return "retry_later", error, backoff(job.attempts, self._backoff_base, self._backoff_max)

    async def _stop(self, call: asyncio.Task[BaseException | None]) -> None:
        call.cancel()
        await asyncio.wait({call}, timeout=self._cancel_grace)
        if not call.done():
            # A handler that swallows cancellation keeps running, but its slot moves on.
            log.warning("handler did not stop when cancelled")

    async def _call(self, handler: Handler, payload: Any, ctx: JobContext) -> BaseException | None:
        """Run the handler; return what it raised (None on success) instead of raising it."""
        try:
            if inspect.iscoroutinefunction(handler):
                await handler(payload, ctx)
            else:
                # Copy the context so lines a threaded handler logs carry the job's fields.
                run = functools.partial(contextvars.copy_context().run, handler, payload, ctx)
                result = await asyncio.get_running_loop().run_in_executor(self._threads, run)
                if inspect.isawaitable(result):
                    await result
            return None
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # timeout or shutdown: the caller decides the outcome
            return exc  # a cancellation from inside the handler, e.g. of a thread's future
        except BaseException as exc:  # a handler must never take the worker process down
            return exc


def _error_text(exc: BaseException) -> str:
    text = describe(exc).replace("\x00", "\\x00")
    return text if len(text) <= _MAX_ERROR else text[: _MAX_ERROR - 3] + "..."
