"""Job handlers of the chaos run, loaded by both services through JOB_HANDLERS.

Every execution appends a `start` record and, unless its process dies first,
an `end` record to a per-process file under CHAOS_LOG_DIR: one JSON line per
record, written with a single O_APPEND write, so a SIGKILL can cut the log
short but never interleave or half-write a record. The invariant checker
reads these files together with the database and the services' logs.

    chaos-fast       returns at once
    chaos-slow       sleeps payload["seconds"] (longer than JOB_TIMEOUT, even the lease,
                     for some jobs); honours cancellation
    chaos-flaky      raises on its first payload["fail_times"] attempts, then succeeds
    chaos-permanent  raises PermanentError
    chaos-bulk       sleeps payload["seconds"]; the type the chaos operator cancels in bulk
    chaos-long       sleeps payload["seconds"], several times the lease: its heartbeats
                     must keep the job its holder's until it returns. Attempts after the
                     first sleep payload["later_seconds"] if given (a paused one's re-run
                     need not keep the run waiting)
    chaos-probe      blocks its event loop for payload["seconds"]; the run pauses the
                     process running it (SIGSTOP) past the lease to create a stale writer.
                     Blocking, so that once resumed the handler returns and its outcome
                     write goes out before a heartbeat can find the lease lost and stop it
    chaos-block-loop a broken `async def`: time.sleep(payload["seconds"]) blocks its
                     process's event loop until the supervisor kills the process
    chaos-hang       a plain `def` that sleeps payload["seconds"] in its thread, past
                     JOB_TIMEOUT: the thread cannot be stopped and is abandoned
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from jobcore import JobContext, PermanentError, handler

LOG_DIR_VARIABLE = "CHAOS_LOG_DIR"

_fd: tuple[int, int] | None = None  # (pid, file descriptor) of this process's log


def _log_fd() -> int | None:
    global _fd
    directory = os.environ.get(LOG_DIR_VARIABLE)
    if not directory:
        return None
    pid = os.getpid()
    if _fd is None or _fd[0] != pid:
        path = os.path.join(directory, f"exec-{pid}.jsonl")
        _fd = (pid, os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    return _fd[1]


def record(event: str, ctx: JobContext, outcome: str | None = None) -> None:
    """Append one execution record: `start`, or `end` with its outcome."""
    fd = _log_fd()
    if fd is None:
        return
    entry = {
        "event": event,
        "job_id": str(ctx.job_id),
        "type": ctx.type,
        "attempt": ctx.attempt,
        "max_attempts": ctx.max_attempts,
        "lease_token": ctx.lease_token,
        "pid": os.getpid(),
        "t": time.time(),
        "outcome": outcome,
    }
    os.write(fd, (json.dumps(entry) + "\n").encode())


Body = Callable[[Any, JobContext], Awaitable[None]]


def _recorded(job_type: str) -> Callable[[Body], Body]:
    """Register `body` as the handler of `job_type`, with start and end records around it."""

    def register(body: Body) -> Body:
        @functools.wraps(body)
        async def run(payload: Any, ctx: JobContext) -> None:
            record("start", ctx)
            outcome = "error"
            try:
                await body(payload, ctx)
                outcome = "ok"
            except PermanentError:
                outcome = "permanent"
                raise
            except asyncio.CancelledError:
                outcome = "cancelled"
                raise
            finally:
                record("end", ctx, outcome)

        handler(job_type)(run)
        return run

    return register


SyncBody = Callable[[Any, JobContext], None]


def _recorded_sync(job_type: str) -> Callable[[SyncBody], SyncBody]:
    """`_recorded` for a plain `def` handler, which runs in a thread."""

    def register(body: SyncBody) -> SyncBody:
        @functools.wraps(body)
        def run(payload: Any, ctx: JobContext) -> None:
            record("start", ctx)
            outcome = "error"
            try:
                body(payload, ctx)
                outcome = "ok"
            finally:
                record("end", ctx, outcome)

        handler(job_type)(run)
        return run

    return register


@_recorded("chaos-fast")
async def fast(payload: Any, ctx: JobContext) -> None:
    return None


@_recorded("chaos-slow")
async def slow(payload: Any, ctx: JobContext) -> None:
    await asyncio.sleep(float(payload["seconds"]))


@_recorded("chaos-bulk")
async def bulk(payload: Any, ctx: JobContext) -> None:
    await asyncio.sleep(float(payload["seconds"]))


@_recorded("chaos-flaky")
async def flaky(payload: Any, ctx: JobContext) -> None:
    if ctx.attempt <= int(payload["fail_times"]):
        raise RuntimeError(f"flaky: attempt {ctx.attempt} fails on purpose")


@_recorded("chaos-permanent")
async def permanent(payload: Any, ctx: JobContext) -> None:
    raise PermanentError("permanent: this job can never succeed")


@_recorded("chaos-long")
async def long_job(payload: Any, ctx: JobContext) -> None:
    seconds = payload["seconds"] if ctx.attempt == 1 else payload.get("later_seconds")
    await asyncio.sleep(float(seconds if seconds is not None else payload["seconds"]))


@_recorded("chaos-probe")
async def probe(payload: Any, ctx: JobContext) -> None:
    time.sleep(float(payload["seconds"]))  # noqa: ASYNC251 - the stale writer, see above


@_recorded("chaos-block-loop")
async def block_loop(payload: Any, ctx: JobContext) -> None:
    time.sleep(float(payload["seconds"]))  # noqa: ASYNC251 - the fault being injected


@_recorded_sync("chaos-hang")
def hang(payload: Any, ctx: JobContext) -> None:
    time.sleep(float(payload["seconds"]))
