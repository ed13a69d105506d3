"""The shape every background loop shares: run_once now, then every interval until
stopped; a failing round is retried after growing waits, logged once per run of failures."""

from __future__ import annotations

import asyncio
import logging

import pytest

from jobcore.backoff import Retry
from jobqueue_worker.loops import Loop


class Counting(Loop):
    name = "counting"

    def __init__(self, interval: float, fail: int = 0) -> None:
        super().__init__(interval, Retry(0.01, 0.02))
        self.rounds = 0
        self.fail = fail

    async def run_once(self) -> int:
        self.rounds += 1
        if self.rounds <= self.fail:
            raise ConnectionError("refused")
        return self.rounds


async def test_a_loop_runs_at_once_then_every_interval_until_stopped():
    loop = Counting(interval=3600)
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    await asyncio.sleep(0.05)
    assert loop.rounds == 1  # at once, and not again within the interval
    stop.set()
    await asyncio.wait_for(task, 1)


async def test_a_nudge_runs_the_next_round_at_once_even_one_made_during_a_round():
    loop = Counting(interval=3600)
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    await until_rounds(loop, 1)
    loop.nudge()
    await until_rounds(loop, 2)
    original = loop.run_once

    async def nudging() -> int:
        if loop.rounds == 2:
            loop.nudge()  # during the round: the wait after it is cut short too
        return await original()

    loop.run_once = nudging  # type: ignore[method-assign]
    loop.nudge()
    await until_rounds(loop, 4)
    await asyncio.sleep(0.05)
    assert loop.rounds == 4  # and then it waits out its interval again
    stop.set()
    await asyncio.wait_for(task, 1)


async def until_rounds(loop: Counting, n: int) -> None:
    async with asyncio.timeout(2):
        while loop.rounds < n:  # noqa: ASYNC110 - polls the loop under test, with a deadline
            await asyncio.sleep(0.005)


async def test_failing_rounds_are_retried_soon_and_logged_once(caplog):
    loop = Counting(interval=3600, fail=3)
    stop = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        task = asyncio.create_task(loop.run(stop))
        for _ in range(100):
            if loop.rounds >= 4:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 1)
    assert loop.rounds == 4
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("loop failing") == 1
    assert messages.count("loop recovered") == 1


def test_a_loop_refuses_an_interval_that_is_not_positive():
    with pytest.raises(ValueError, match="counting"):
        Counting(interval=0)
