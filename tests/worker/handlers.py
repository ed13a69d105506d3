"""Job handlers for worker tests, loaded by real worker processes with
`JOB_HANDLERS=tests.worker.handlers` (and PYTHONPATH at the repository root).

Each execution appends one line `<event> <job_id> <attempt> <pid>` to the file
named by $WORKER_TEST_LOG, with a single O_APPEND write, so lines from many
processes never interleave. Tests read that file as the execution log
(`tests.worker.support.read_log`); they do not import this module themselves.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from jobcore import JobContext, PermanentError, Snooze, handler


def append(suffix: str, line: str) -> None:
    """Append `line` to $WORKER_TEST_LOG + `suffix` with one O_APPEND write, so lines
    from many processes never interleave."""
    path = os.environ.get("WORKER_TEST_LOG")
    if not path:
        return
    fd = os.open(path + suffix, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def note(event: str, ctx: JobContext) -> None:
    append("", f"{event} {ctx.job_id} {ctx.attempt} {os.getpid()}")


@handler("test.record")
async def record(payload: Any, ctx: JobContext) -> None:
    """Note the run, then sleep payload["seconds"] (default 0)."""
    note("run", ctx)
    await asyncio.sleep(float(payload.get("seconds", 0)))
    note("done", ctx)


@handler("test.fenced")
async def fenced(payload: Any, ctx: JobContext) -> None:
    """As test.record, and append `<job_id> <lease_token> <pid>` to $WORKER_TEST_LOG.tokens
    first: which claims ran, to tell an attempt run twice under one token."""
    append(".tokens", f"{ctx.job_id} {ctx.lease_token} {os.getpid()}")
    note("run", ctx)
    await asyncio.sleep(float(payload.get("seconds", 0)))
    note("done", ctx)


@handler("test.block")
async def block(payload: Any, ctx: JobContext) -> None:
    """Hang on the first `block_attempts` attempts (default 1); succeed after that."""
    note("run", ctx)
    if ctx.attempt <= int(payload.get("block_attempts", 1)):
        await asyncio.sleep(3600)


@handler("test.crash")
def crash(payload: Any, ctx: JobContext) -> None:
    """A poison pill: kills the whole worker process."""
    note("run", ctx)
    os._exit(1)


@handler("test.fail")
async def fail(payload: Any, ctx: JobContext) -> None:
    note("run", ctx)
    raise RuntimeError("this job always fails")


@handler("test.permanent")
async def permanent(payload: Any, ctx: JobContext) -> None:
    note("run", ctx)
    raise PermanentError("this job can never succeed")


@handler("test.flag")
def flag(payload: Any, ctx: JobContext) -> None:
    """Fails while the file payload["path"] exists."""
    note("run", ctx)
    if Path(payload["path"]).exists():
        raise RuntimeError("the flag file is still there")


@handler("test.sleep_sync")
def sleep_sync(payload: Any, ctx: JobContext) -> None:
    """A plain def handler that cannot be cancelled: sleeps payload["seconds"] in its thread."""
    note("run", ctx)
    time.sleep(float(payload.get("seconds", 0)))
    note("done", ctx)


@handler("test.block_loop")
async def block_loop(payload: Any, ctx: JobContext) -> None:
    """A broken async handler: blocks its process's event loop for payload["seconds"]."""
    note("run", ctx)
    time.sleep(float(payload.get("seconds", 0)))  # noqa: ASYNC251 - the fault under test
    note("done", ctx)


def stamp(ctx: JobContext) -> None:
    """Append `<job_id> <attempt> <time.time()>` to $WORKER_TEST_LOG.times: when each
    attempt's handler started, on the machine's clock (the database's too, here)."""
    append(".times", f"{ctx.job_id} {ctx.attempt} {time.time():.6f}")


@handler("test.stamp")
async def stamped(payload: Any, ctx: JobContext) -> None:
    """Note when the attempt started, then sleep payload["seconds"] (default 0)."""
    stamp(ctx)
    note("run", ctx)
    await asyncio.sleep(float(payload.get("seconds", 0)))


@handler("test.snooze_once")
def snooze_once(payload: Any, ctx: JobContext) -> None:
    """Snoozes for payload["seconds"] the first time it runs, then completes."""
    stamp(ctx)
    note("run", ctx)
    if not Path(payload["marker"]).exists():
        Path(payload["marker"]).touch()
        raise Snooze(payload["seconds"])


@handler("test.span")
async def span(payload: Any, ctx: JobContext) -> None:
    """Sleep payload["seconds"] (default 0), then append `<job_id> <attempt> <start> <end>`
    (time.time()) to $WORKER_TEST_LOG.spans: when the handler ran, for overlap checks."""
    started = time.time()
    await asyncio.sleep(float(payload.get("seconds", 0)))
    append(".spans", f"{ctx.job_id} {ctx.attempt} {started:.6f} {time.time():.6f}")


@handler("test.overrun")
def overrun(payload: Any, ctx: JobContext) -> None:
    """A plain def handler that sleeps payload["seconds"] whatever its timeout says (a
    thread cannot be stopped), then appends its span as `test.span` does."""
    started = time.time()
    time.sleep(float(payload.get("seconds", 0)))
    append(".spans", f"{ctx.job_id} {ctx.attempt} {started:.6f} {time.time():.6f}")


@handler("test.stoppable")
def stoppable(payload: Any, ctx: JobContext) -> None:
    """A plain def handler that polls `ctx.cancelled` for payload["seconds"] (default 60):
    notes "stopped" and returns once it is set, else notes "done"."""
    note("run", ctx)
    if ctx.cancelled.wait(float(payload.get("seconds", 60))):
        note("stopped", ctx)
    else:
        note("done", ctx)


@handler("test.race")
async def race(payload: Any, ctx: JobContext) -> dict[str, Any]:
    """Stamp the start, sleep payload["seconds"], note "done" and return a result naming the
    job; a cancellation during the sleep notes "stopped"."""
    stamp(ctx)
    try:
        await asyncio.sleep(float(payload["seconds"]))
    except asyncio.CancelledError:
        note("stopped", ctx)
        raise
    note("done", ctx)
    return {"job": str(ctx.job_id), "kind": "async"}


@handler("test.race_sync")
def race_sync(payload: Any, ctx: JobContext) -> dict[str, Any] | None:
    """`test.race` as a plain def handler, stopped through `ctx.cancelled`."""
    stamp(ctx)
    if ctx.cancelled.wait(float(payload["seconds"])):
        note("stopped", ctx)
        return None
    note("done", ctx)
    return {"job": str(ctx.job_id), "kind": "sync"}


@handler("test.returns")
def returns(payload: Any, ctx: JobContext) -> Any:
    """Returns payload["value"]; a complex number if payload["unserialisable"]; a string of
    payload["chars"] characters if given."""
    note("run", ctx)
    if payload.get("unserialisable"):
        return 1j
    if "chars" in payload:
        return "x" * int(payload["chars"])
    return payload.get("value")


@handler("test.interval")
async def interval(payload: Any, ctx: JobContext) -> None:
    """Append `start <job_id> <attempt> <pid> <time>` to $WORKER_TEST_LOG.intervals, sleep
    payload["seconds"] (default 0), then append the same with `end`: a run killed
    mid-handler leaves its start without an end."""
    line = f"{ctx.job_id} {ctx.attempt} {os.getpid()}"
    append(".intervals", f"start {line} {time.time():.6f}")
    await asyncio.sleep(float(payload.get("seconds", 0)))
    append(".intervals", f"end {line} {time.time():.6f}")
