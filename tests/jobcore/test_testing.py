"""jobcore.testing.run: a handler run in the calling process with a real JobContext, under
its timeout (ctx.cancelled set, an async one cancelled), returning its result as stored and
raising what it raises; arun inside an event loop."""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import threading
import time
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest

from jobcore import JobContext, PermanentError, handler
from jobcore.results import ResultError
from jobcore.testing import HandlerTimeout, UnknownHandler, arun, run


class Colour(enum.Enum):
    RED = "red"


@handler("test.testing.context", max_attempts=4, timeout="7s")
async def context(payload: Any, ctx: JobContext) -> dict[str, Any]:
    return {"type": ctx.type, "attempt": ctx.attempt, "max_attempts": ctx.max_attempts}


@handler("test.testing.values")
def values(payload: Any, ctx: JobContext) -> Any:
    return {
        "at": dt.datetime(2026, 3, 1, 12, 30, tzinfo=dt.UTC),
        "day": dt.date(2026, 3, 1),
        "amount": Decimal("12.50"),
        "id": UUID(int=5),
        "colour": Colour.RED,
        "pair": (1, 2),
        "tags": {"b", "a"},
    }


@handler("test.testing.fails")
def fails(payload: Any, ctx: JobContext) -> None:
    raise PermanentError(f"bad {payload['n']}")


@handler("test.testing.unstorable")
async def unstorable(payload: Any, ctx: JobContext) -> Any:
    return object()


seen: dict[str, Any] = {}


@handler("test.testing.waits")
def waits(payload: Any, ctx: JobContext) -> str:
    seen["thread"] = threading.current_thread().name
    seen["stopped"] = ctx.cancelled.wait(10)
    return "too late"


@handler("test.testing.sleeps")
async def sleeps(payload: Any, ctx: JobContext) -> None:
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        seen["cancelled"] = ctx.cancelled.is_set()
        raise


def test_run_gives_the_handler_a_real_context_with_its_options():
    assert run(context) == {"type": "test.testing.context", "attempt": 1, "max_attempts": 4}
    assert run(context, attempt=2, max_attempts=9)["attempt"] == 2
    assert run("test.testing.context")["max_attempts"] == 4  # by type, too


def test_the_result_comes_back_as_stored_with_the_conversions():
    assert run(values) == {
        "at": "2026-03-01T12:30:00+00:00",
        "day": "2026-03-01",
        "amount": "12.50",
        "id": "00000000-0000-0000-0000-000000000005",
        "colour": "red",
        "pair": [1, 2],
        "tags": ["a", "b"],
    }


def test_what_the_handler_raises_is_raised():
    with pytest.raises(PermanentError, match="bad 3"):
        run(fails, {"n": 3})
    with pytest.raises(ResultError, match="not JSON-serialisable"):
        run(unstorable)
    with pytest.raises(UnknownHandler):
        run("test.testing.nobody")


def test_a_plain_handler_past_its_timeout_sees_cancelled_and_run_raises_a_timeout():
    seen.clear()
    started = time.monotonic()
    with pytest.raises(HandlerTimeout, match="timed out after 1s") as caught:
        run(waits, timeout=1)
    assert isinstance(caught.value, TimeoutError)
    assert 1 <= time.monotonic() - started < 5
    assert seen["stopped"] is True and seen["thread"] != threading.current_thread().name


def test_an_async_handler_past_its_timeout_is_cancelled_with_cancelled_set():
    seen.clear()
    with pytest.raises(HandlerTimeout):
        run(sleeps, timeout="1s")
    assert seen["cancelled"] is True


def test_run_refuses_a_running_loop_and_arun_works_there():
    async def inside() -> Any:
        with pytest.raises(RuntimeError, match="arun"):
            run(context)
        return await arun(context, attempt=3)

    assert asyncio.run(inside())["attempt"] == 3


def test_a_cancelled_arun_stops_the_handler():
    seen.clear()

    async def inside() -> None:
        task = asyncio.create_task(arun(sleeps))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(inside())
    assert seen["cancelled"] is True


def test_the_builtin_sleep_handler_runs_by_type():
    assert run("sleep", {"duration": "10ms"}) is None
