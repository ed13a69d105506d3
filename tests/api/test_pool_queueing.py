"""A burst that keeps every pooled connection busy makes requests wait, not fail.

Regression: the pool's checkout timeout was the connect timeout (2 s), so under
200 concurrent clients requests queued behind a full pool were answered
503 "database unavailable" while the database was fine.
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx

from jobqueue_api.database import CONNECT_TIMEOUT, POOL_SIZE, REQUEST_DEADLINE
from tests.api.conftest import app_of


async def test_request_queued_behind_a_full_pool_past_the_connect_timeout_is_served(
    api: httpx.AsyncClient,
) -> None:
    engine = app_of(api).state.engine
    # Release the pool between the connect timeout and the request deadline.
    hold = (CONNECT_TIMEOUT + REQUEST_DEADLINE) / 2
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(POOL_SIZE):
            await stack.enter_async_context(engine.connect())
        request = asyncio.create_task(api.post("/jobs", json={"type": "sleep"}))
        # The condition under test is a wait longer than the connect timeout.
        await asyncio.sleep(hold)
        assert not request.done(), request.result().text
    r = await request
    assert r.status_code == 201, r.text
