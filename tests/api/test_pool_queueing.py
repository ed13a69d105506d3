"""A burst that keeps every pooled connection busy makes requests wait their turn, not fail.

Regressions: the pool's checkout timeout was the connect timeout (2 s), and the
async pool let a newcomer take a just-returned connection ahead of the request
woken for it; under 200 concurrent clients both ended in 503 "database
unavailable" while the database was fine.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools

import httpx
import sqlalchemy as sa

from jobqueue_api.database import CONNECT_TIMEOUT, POOL_SIZE, REQUEST_DEADLINE, in_turn
from jobqueue_api.state import state_of
from tests.api.conftest import app_of


async def test_request_queued_behind_a_full_pool_past_the_connect_timeout_is_served(
    api: httpx.AsyncClient,
) -> None:
    engine = state_of(app_of(api)).engine
    # Release the pool between the connect timeout and the request deadline.
    hold = (CONNECT_TIMEOUT + REQUEST_DEADLINE) / 2
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(POOL_SIZE):
            await stack.enter_async_context(in_turn(engine))
            await stack.enter_async_context(engine.connect())
        request = asyncio.create_task(api.post("/jobs", json={"type": "sleep"}))
        # The condition under test is a wait longer than the connect timeout.
        await asyncio.sleep(hold)
        assert not request.done(), request.result().text
    r = await request
    assert r.status_code == 201, r.text


async def test_under_a_burst_no_request_is_overtaken_by_many_that_came_after_it(
    api: httpx.AsyncClient,
) -> None:
    # 200 tasks query back to back through the API's engine, as requests do. Each takes
    # a ticket on arrival; for each checkout, count the later tickets served before it.
    # In turn, only the few that were connecting alongside it can pass it; the bare
    # pool sent waiters to the back again and again (overtaken by 500+ here).
    engine = state_of(app_of(api)).engine
    tickets = itertools.count()
    served: list[int] = []
    rounds = 8  # a fixed amount of work, so a slow machine cannot shrink the sample

    async def requester() -> None:
        for _ in range(rounds):
            ticket = next(tickets)
            async with in_turn(engine), engine.connect() as conn:
                served.append(ticket)
                await conn.execute(sa.text("SELECT 1"))

    await asyncio.gather(*(requester() for _ in range(200)))
    earlier: list[int] = []
    worst = 0
    for ticket in served:
        worst = max(worst, len(earlier) - bisect.bisect_right(earlier, ticket))
        bisect.insort(earlier, ticket)
    assert len(served) == 200 * rounds
    assert worst <= 10 * POOL_SIZE, worst
