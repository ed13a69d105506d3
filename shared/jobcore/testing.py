"""Running a handler in a test, without a database or a worker:

    from jobcore.testing import run

    assert run(send_receipt, {"order": 42}) == {"sent": True}

`run(task_or_type, payload=None, *, attempt=1, max_attempts=None, timeout=None)` calls the
handler in this process as the worker would: with a real `JobContext` (a fresh job id, the
attempt, `max_attempts`), under the attempt's timeout (`timeout`, else the handler's option,
else JOB_TIMEOUT's default), in a thread of its own for a plain `def`. It returns the result
as the job would store it (encoded by `jobcore.results`, with its conversions, and decoded
again: a tuple comes back a list, a datetime its text) and raises what the handler raises.
When the timeout runs out, `ctx.cancelled` is set, an `async def` handler is cancelled,
and `run` raises `HandlerTimeout` (a TimeoutError) once the handler stopped, or after
`GRACE` seconds if it does not: an attempt that times out fails whatever it returns then.

`run` is for synchronous code; inside a running event loop (an async test) await
`arun(...)`, which takes the same arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import threading
from typing import Any

from jobcore.durations import parse_duration
from jobcore.errors import JobqueueError
from jobcore.ids import new_id
from jobcore.registry import BUILTIN_MODULES, JobContext, get_registration
from jobcore.results import decode_result, encode_result
from jobcore.task import Task

# The worker's defaults (JOB_TIMEOUT, MAX_ATTEMPTS, MAX_RESULT_BYTES), which `run` uses for
# what neither its arguments nor the handler's options give.
DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_MAX_RESULT_BYTES = 65_536
# How long a handler told to stop is waited for, as the worker's CANCEL_GRACE.
GRACE = 5.0


class HandlerTimeout(JobqueueError, TimeoutError):
    """The handler ran past the attempt's timeout (the worker retries such an attempt)."""


class UnknownHandler(JobqueueError, LookupError):
    """No handler is registered for the type given to `run`."""


def run(
    task_or_type: Task[Any, Any] | str,
    payload: Any = None,
    *,
    attempt: int = 1,
    max_attempts: int | None = None,
    timeout: float | str | None = None,
) -> Any:
    """Run the handler once, as a worker would; its result as stored (see the module)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            "jobcore.testing.run() cannot block a running event loop: "
            "use `await jobcore.testing.arun(...)` there"
        )
    return asyncio.run(
        arun(task_or_type, payload, attempt=attempt, max_attempts=max_attempts, timeout=timeout)
    )


async def arun(
    task_or_type: Task[Any, Any] | str,
    payload: Any = None,
    *,
    attempt: int = 1,
    max_attempts: int | None = None,
    # The attempt's own timeout, enforced as the worker enforces it (not the caller's).
    timeout: float | str | None = None,  # noqa: ASYNC109
) -> Any:
    """`run`, awaited in the caller's event loop."""
    job_type = task_or_type.type if isinstance(task_or_type, Task) else task_or_type
    registration = get_registration(job_type)
    if registration is None and job_type in _BUILTIN_TYPES:
        for name in BUILTIN_MODULES:
            importlib.import_module(name)
        registration = get_registration(job_type)
    if registration is None:
        raise UnknownHandler(f"no handler is registered for job type {job_type!r}")
    fn = task_or_type.fn if isinstance(task_or_type, Task) else registration.fn
    options = registration.options
    if max_attempts is None:
        max_attempts = options.max_attempts or DEFAULT_MAX_ATTEMPTS
    if not 1 <= attempt <= max_attempts:
        raise ValueError(f"attempt must be from 1 to max_attempts ({max_attempts}), got {attempt}")
    seconds = parse_duration(timeout) if timeout is not None else options.timeout
    if seconds is None:
        seconds = DEFAULT_TIMEOUT
    ctx = JobContext(job_id=new_id(), type=job_type, attempt=attempt, max_attempts=max_attempts)
    payload = {} if payload is None else payload
    value = await _attempt(fn, payload, ctx, seconds)
    if value is None:
        return None
    return decode_result(encode_result(value, DEFAULT_MAX_RESULT_BYTES))


_BUILTIN_TYPES = frozenset({"sleep", "webhook"})


async def _attempt(fn: Any, payload: Any, ctx: JobContext, seconds: float) -> Any:
    """The handler's return value; HandlerTimeout past `seconds`."""
    deadline = asyncio.get_running_loop().time() + seconds
    if inspect.iscoroutinefunction(fn):
        work: asyncio.Future[Any] = asyncio.ensure_future(fn(payload, ctx))
    else:
        work = _in_thread(fn, payload, ctx)
    value = await _within(work, ctx, deadline, seconds)
    if inspect.isawaitable(value):  # a plain def that returned a coroutine: as the worker does
        value = await _within(asyncio.ensure_future(value), ctx, deadline, seconds)
    return value


async def _within(
    work: asyncio.Future[Any], ctx: JobContext, deadline: float, seconds: float
) -> Any:
    try:
        done, _ = await asyncio.wait({work}, timeout=deadline - asyncio.get_running_loop().time())
    except asyncio.CancelledError:  # the caller gave up: so does the handler
        ctx.stop()
        work.cancel()
        raise
    if not done:
        ctx.stop()
        if isinstance(work, asyncio.Task):  # a thread cannot be cancelled: it has to look
            work.cancel()
        # The handler has GRACE to stop; what it returns or raises then is ignored, as the
        # worker records a timed-out attempt as timed out.
        with contextlib.suppress(BaseException):
            await asyncio.wait({work}, timeout=GRACE)
        raise HandlerTimeout(f"timed out after {seconds:g}s")
    return work.result()


def _in_thread(fn: Any, payload: Any, ctx: JobContext) -> asyncio.Future[Any]:
    """Run `fn` in a daemon thread of its own (not the loop's executor: a handler that never
    returns must not hold up the end of `asyncio.run`)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def target() -> None:
        try:
            value = fn(payload, ctx)
        except BaseException as exc:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(settle, None, exc)
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, value, None)

    threading.Thread(target=target, name=f"handler {ctx.type}", daemon=True).start()
    return future
