"""`jobcore.client.AsyncClient` against the same real `jobqueue-api` and worker: the calls
and errors of the sync client, awaited, and the same retries (the flows are shared)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from jobcore.client import (
    AsyncClient,
    Conflict,
    Invalid,
    NotFound,
    Retries,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from jobcore.states import Status
from tests.faultproxy import FaultProxy
from tests.jobcore.client.conftest import LATE, PATIENT, TOKEN, WAIT, Stack, polls_end_in_time
from tests.procs import free_port
from tests.worker.support import until

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("jobcore_client")]

FAST = Retries(attempts=4, total=10.0, base=0.05, cap=0.2)


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(stack.url, TOKEN, retries=FAST) as client:
        yield client


async def test_submit_get_wait_and_the_typed_errors(client: AsyncClient, queue: str):
    job = await client.submit("sleep", {"duration": "0.2s"}, idempotency_key=f"{queue}-k")
    assert job.status == Status.PENDING and job.queue == "default"
    # The same job (a worker may have started it already: its status may differ).
    replayed = await client.submit("sleep", {"duration": "0.2s"}, idempotency_key=f"{queue}-k")
    assert replayed.id == job.id and replayed.created_at == job.created_at
    with pytest.raises(Conflict):
        await client.submit("sleep", {"duration": "9s"}, idempotency_key=f"{queue}-k")
    with pytest.raises(Invalid, match="unknown job type"):
        await client.submit("no.such.type")
    done = await client.wait(job.id, timeout=30)
    assert done.status == Status.COMPLETED and done.finished_at is not None
    assert (await client.get(job.id)) == done
    with pytest.raises(NotFound):
        await client.get("01a22aae-32d0-7c31-b68d-fb41a7ea06d6")
    idle = await client.submit("sleep", queue=queue)
    with pytest.raises(WaitTimeout) as raised:
        await client.wait(idle.id, timeout=0.3)
    assert raised.value.job.status == Status.PENDING


async def test_cancel_retry_list_and_queues(client: AsyncClient, queue: str):
    ids = [(await client.submit("sleep", {"n": n}, queue=queue)).id for n in range(5)]
    assert (await client.cancel(ids[0])).status == Status.CANCELLED
    with pytest.raises(Conflict):
        await client.cancel(ids[0])
    assert (await client.retry(ids[0])).status == Status.PENDING
    with pytest.raises(Conflict):
        await client.retry(ids[0])
    listed = [job.id async for job in client.list(queue=queue, page_size=2)]
    assert listed == ids[::-1]
    (depth,) = [depth for depth in await client.queues() if depth.queue == queue]
    assert depth.pending == 5


async def test_submit_many_reports_each_item(client: AsyncClient, stack: Stack, queue: str):
    items = [{"type": "sleep", "queue": queue, "payload": {"i": i}} for i in range(20)]
    results = await client.submit_many(items)
    assert [r.status for r in results] == ["created"] * 20
    assert stack.jobs_in(queue) == 20


async def test_a_cut_connection_is_retried_and_creates_exactly_one_job(stack: Stack, queue: str):
    with FaultProxy(("127.0.0.1", stack.api.port)) as proxy:
        async with AsyncClient(f"http://127.0.0.1:{proxy.port}", TOKEN, retries=FAST) as client:
            proxy.add_latency(0.5)
            submitted = asyncio.ensure_future(client.submit("sleep", queue=queue))
            await until(lambda: stack.jobs_in(queue) == 1, 10, "the job to be written")
            proxy.cut()
            proxy.pass_through()
            job = await asyncio.wait_for(submitted, 30)
        assert proxy.accepted >= 2
    assert stack.jobs_in(queue) == 1
    assert stack.count("SELECT count(*) FROM jobqueue.jobs WHERE id = %s", job.id) == 1


async def test_503_is_retried_after_retry_after_and_unreachable_is_unavailable(
    client: AsyncClient, scripted: Any, queue: str
):
    record = (await client.submit("sleep", queue=queue)).raw
    server = scripted(
        (503, {"Retry-After": "1"}, b'{"error":"database unavailable"}'),
        (200, {}, json.dumps(dict(record)).encode()),
    )
    async with AsyncClient(server.url, retries=Retries(base=0.01, cap=0.02)) as fast:
        job = await fast.get(record["id"])
    assert job.id == record["id"]
    assert len(server.times) == 2 and server.times[1] - server.times[0] >= 1.0

    started = time.monotonic()
    url = f"http://127.0.0.1:{free_port()}"
    async with AsyncClient(url, retries=Retries(attempts=3, base=0.05, cap=0.1)) as down:
        with pytest.raises(Unavailable, match=r"\(3 tries\)"):
            await down.queues()
    assert time.monotonic() - started < 5


async def test_a_wrong_token_is_unauthorized(stack: Stack):
    async with AsyncClient(stack.url, "wrong", retries=FAST) as client:
        with pytest.raises(Unauthorized, match="missing or invalid bearer token"):
            await client.get("01a22aae-32d0-7c31-b68d-fb41a7ea06d6")


@pytest.mark.parametrize("mode", ["drop", "stall"])
@pytest.mark.parametrize("answered", [1, 0])
async def test_a_wait_whose_long_polls_break_ends_at_its_timeout(
    long_polls: Any, mode: str, answered: int
):
    """As the sync client's: the wait's timeout bounds its retries and each request."""
    api = long_polls(mode, answered)
    expected = WaitTimeout if answered else Unavailable
    async with AsyncClient(api.url, retries=PATIENT) as client:
        started = time.monotonic()
        with pytest.raises(expected) as raised:
            # else TimeoutError: the wait overran
            await asyncio.wait_for(client.wait(api.job["id"], WAIT), WAIT + LATE)
        elapsed = time.monotonic() - started
    assert WAIT - 0.01 <= elapsed < WAIT + LATE
    if isinstance(raised.value, WaitTimeout):
        assert raised.value.job.id == api.job["id"] and raised.value.job.status == "pending"
    polls_end_in_time(api, started)
