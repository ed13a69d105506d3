"""GET /jobs/{id}?wait= against the real `jobqueue-api` process: a thousand concurrent
waiters on one process, the latency from a finishing commit to the answer, shutdown, and
clients that leave while waiting."""

from __future__ import annotations

import asyncio
import json
import resource
import signal
import statistics
import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import compiled, store
from jobcore.db import session_name
from jobcore.ids import new_id
from jobcore.rows import Lease, NewJob
from jobcore.states import Operation, Status
from tests.api.jobstates import end, submit, take
from tests.e2e.test_api_process import Api
from tests.pg import driver

pytestmark = pytest.mark.e2e

WAITERS = 1000

_TAKE_ALL = sa.text(
    "UPDATE jobqueue.jobs SET status = 'processing', attempts = 1, lease_token = lease_token + 1, "
    "locked_until = now() + interval '10 minutes' WHERE status = 'pending' "
    "RETURNING id, lease_token"
)
_AWAITED = sa.text("SELECT count(*) FROM jobqueue.jobs WHERE awaited")
_BACKENDS = sa.text(
    "SELECT application_name, count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND application_name LIKE 'jobqueue-api%' "
    "GROUP BY application_name"
)


async def _until(check: Callable[[], Any], what: str, within: float) -> Any:
    deadline = time.monotonic() + within
    while not (found := await check()):
        assert time.monotonic() < deadline, f"timed out after {within}s waiting for {what}"
        await asyncio.sleep(0.01)
    return found


async def _scalar(engine: AsyncEngine, query: Any, **values: Any) -> Any:
    async with engine.connect() as conn:
        return await conn.scalar(query, values)


class RawRequest:
    """One HTTP/1.1 request on a connection of its own, read whole at the end."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def send(cls, api: Api, path: str) -> RawRequest:
        reader, writer = await asyncio.open_connection("127.0.0.1", api.port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        return cls(reader, writer)

    async def answer(self) -> tuple[int, dict[str, Any]]:
        raw = await self.reader.read()
        self.writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), json.loads(body)


def _enough_file_descriptors(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < n:
        if hard != resource.RLIM_INFINITY and hard < n:
            pytest.skip(f"needs {n} file descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


async def test_a_thousand_concurrent_waiters_on_one_process_are_all_answered_when_their_jobs_finish(
    start_api: Callable[..., Api], engine: AsyncEngine
):
    _enough_file_descriptors(WAITERS * 2 + 200)
    api = start_api(MAX_CONNECTIONS=str(WAITERS + 100), LOG_LEVEL="warning")
    batch = [NewJob(new_id(), "sleep", {}, 3) for _ in range(WAITERS)]
    async with engine.begin() as conn:
        await store.submit_many(conn, batch)
        leases = [Lease(row.id, row.lease_token) for row in await conn.execute(_TAKE_ALL)]
    assert len(leases) == WAITERS

    opening = asyncio.Semaphore(100)  # the listen backlog: a flood of SYNs would be dropped

    async def wait_for(job_id: UUID) -> RawRequest:
        async with opening:
            return await RawRequest.send(api, f"/jobs/{job_id}?wait=60s")

    requests = await asyncio.gather(*(wait_for(new.id) for new in batch))

    async def all_awaited() -> bool:
        return bool(await _scalar(engine, _AWAITED) == WAITERS)

    await _until(all_awaited, f"{WAITERS} jobs to be awaited", 60)
    async with engine.connect() as conn:
        backends = {name: n for name, n in await conn.execute(_BACKENDS)}
    # The waiters hold no connection each: the pool's (at most 10) and one listener.
    assert backends.get(session_name("jobqueue-api-listen")) == 1, backends
    assert backends.get(session_name("jobqueue-api"), 0) <= 10, backends

    async with engine.begin() as conn:
        lost = await compiled.record(await driver(conn), Operation.COMPLETE, leases)
    assert lost == []
    finished = time.monotonic()
    answers = await asyncio.wait_for(asyncio.gather(*(r.answer() for r in requests)), 60)
    took = time.monotonic() - finished
    print(f"\n{WAITERS} waiters answered {took * 1000:.0f} ms after the finishing commit")
    assert [status for status, _ in answers] == [200] * WAITERS
    assert {body["status"] for _, body in answers} == {"completed"}
    assert sorted(body["id"] for _, body in answers) == sorted(str(new.id) for new in batch)
    assert api.service.stop() == 0, api.service.output()[-3000:]


async def test_a_waiter_is_answered_within_a_second_of_the_finishing_commit(
    start_api: Callable[..., Api], engine: AsyncEngine
):
    api = start_api(LOG_LEVEL="warning")
    latencies = []
    async with httpx.AsyncClient(base_url=api.base, timeout=30) as client:
        for _ in range(200):
            job = await submit(engine)
            lease = await take(engine, job.id)
            waiting = asyncio.create_task(client.get(f"/jobs/{job.id}?wait=10s"))

            async def awaited(job_id: UUID = job.id) -> bool:
                query = sa.text("SELECT awaited FROM jobqueue.jobs WHERE id = :id")
                return bool(await _scalar(engine, query, id=job_id))

            await _until(awaited, "the job to be awaited", 10)
            await end(engine, lease, Status.COMPLETED)
            finished = time.monotonic()
            r = await waiting
            latencies.append(time.monotonic() - finished)
            assert r.json()["status"] == "completed"
    latencies.sort()
    p50, p99 = statistics.median(latencies), latencies[int(len(latencies) * 0.99) - 1]
    print(
        f"\nwait latency over {len(latencies)} waits: p50 {p50 * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms"
    )
    assert latencies[-1] < 1.0
    assert api.service.stop() == 0


async def test_on_sigterm_waiting_requests_are_answered_at_once_with_the_job_as_it_is(
    start_api: Callable[..., Api], engine: AsyncEngine
):
    api = start_api(DRAIN_DELAY="3s")
    job = await submit(engine)
    async with httpx.AsyncClient(base_url=api.base, timeout=30) as client:
        waiting = asyncio.create_task(client.get(f"/jobs/{job.id}?wait=60s"))

        async def awaited() -> bool:
            query = sa.text("SELECT awaited FROM jobqueue.jobs WHERE id = :id")
            return bool(await _scalar(engine, query, id=job.id))

        await _until(awaited, "the job to be awaited", 10)
        api.service.signal(signal.SIGTERM)
        signalled = time.monotonic()
        r = await asyncio.wait_for(waiting, 10)
        assert time.monotonic() - signalled < 1
        assert (r.status_code, r.json()["status"]) == (200, "pending")
        # While draining, a wait does not wait.
        started = time.monotonic()
        again = await client.get(f"/jobs/{job.id}?wait=60s")
        assert time.monotonic() - started < 1 and again.json()["status"] == "pending"
    assert await asyncio.to_thread(api.service.wait, 30) == 0
    messages = [line["msg"] for line in api.service.logs()]
    assert "listening for finished jobs" in messages and messages[-1] == "stopped"


async def test_a_client_that_leaves_while_waiting_frees_its_request_at_once(
    start_api: Callable[..., Api], engine: AsyncEngine
):
    api = start_api()
    job = await submit(engine)
    request = await RawRequest.send(api, f"/jobs/{job.id}?wait=60s")

    async def awaited() -> bool:
        query = sa.text("SELECT awaited FROM jobqueue.jobs WHERE id = :id")
        return bool(await _scalar(engine, query, id=job.id))

    await _until(awaited, "the job to be awaited", 10)
    request.writer.close()
    left = time.monotonic()

    async def logged() -> list[dict[str, Any]]:
        return [
            line
            for line in api.service.logs()
            if line.get("msg") == "request" and line.get("path") == f"/jobs/{job.id}"
        ]

    (line,) = await _until(logged, "the request's access line", 10)
    assert line["status"] == 499
    assert time.monotonic() - left < 3
    assert api.service.stop() == 0
