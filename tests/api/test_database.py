"""Database outages: job endpoints answer 503 within seconds, liveness stays 200,
and the same app serves again once the database is back, with no restart.

The connection path is broken with a TCP proxy between the app and PostgreSQL;
the shared server itself is never touched.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue_api.database import REQUEST_DEADLINE, is_unavailable
from tests.api.conftest import MakeApi, job_count
from tests.faultproxy import FaultProxy

# An outage must be answered within the request deadline plus scheduling slack on a busy machine.
QUICK = REQUEST_DEADLINE + 3.0


@pytest.fixture
def proxy(database_url: str) -> Iterator[FaultProxy]:
    with FaultProxy.to_database(database_url) as proxy:
        yield proxy


@pytest.fixture
async def proxied_api(make_api: MakeApi, proxy: FaultProxy, database_url: str) -> httpx.AsyncClient:
    return await make_api(DATABASE_URL=proxy.database_url(database_url))


async def _timed(request: Awaitable[httpx.Response]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = await request
    return response, time.monotonic() - started


async def _assert_outage(api: httpx.AsyncClient) -> None:
    """During the outage: every job endpoint 503 quickly, /readyz 503, /healthz 200."""
    job = "/jobs/01890000-0000-7000-8000-000000000000"
    timed = await asyncio.gather(
        _timed(api.post("/jobs", json={"type": "sleep"})),
        _timed(api.get(job)),
        _timed(api.get(f"{job}/status")),
        _timed(api.post(f"{job}/retry")),
        _timed(api.post(f"{job}/cancel")),
        _timed(api.get(f"{job}?wait=30s")),
        _timed(api.get(f"{job}?wait=1s")),
        _timed(api.get("/jobs?status=pending")),
        _timed(api.get("/queues")),
        _timed(api.get("/readyz")),
    )
    for r, took in timed:
        assert r.status_code == 503, (r.request.url, r.text)
        assert took < QUICK, f"{r.request.method} {r.request.url.path} took {took:.1f}s"
        if r.request.url.path != "/readyz":
            assert r.json() == {"error": "database unavailable"}
    assert (await api.get("/healthz")).status_code == 200


async def _recovers(api: httpx.AsyncClient, within: float = 20.0) -> httpx.Response:
    """Poll until a submission succeeds again; return it."""
    deadline = time.monotonic() + within
    while True:
        r = await api.post("/jobs", json={"type": "sleep"})
        if r.status_code == 201:
            return r
        assert r.status_code == 503, r.text
        assert time.monotonic() < deadline, "the API did not recover after the database returned"
        await asyncio.sleep(0.2)


async def test_refused_connections_give_quick_503s_and_the_app_recovers_alone(
    proxied_api: httpx.AsyncClient, proxy: FaultProxy, engine: AsyncEngine
):
    api = proxied_api
    assert (await api.post("/jobs", json={"type": "sleep"})).status_code == 201
    assert (await api.get("/readyz")).status_code == 200

    proxy.refuse()
    proxy.cut()  # pooled connections die too
    await _assert_outage(api)

    proxy.pass_through()
    created = await _recovers(api)
    assert (await api.get(f"/jobs/{created.json()['id']}")).status_code == 200
    assert (await api.get("/readyz")).status_code == 200
    assert await job_count(engine) == 2  # nothing half-written during the outage


async def test_a_half_open_database_connection_cannot_hang_a_request(
    proxied_api: httpx.AsyncClient, proxy: FaultProxy
):
    api = proxied_api
    # Warm the pool so requests hit established connections that then go silent.
    await asyncio.gather(*(api.post("/jobs", json={"type": "sleep"}) for _ in range(4)))
    proxy.blackhole()
    await _assert_outage(api)
    # The silent connections were given up on; fresh ones work once the path is back.
    proxy.pass_through()
    await _recovers(api)


async def test_a_submission_during_an_outage_is_either_stored_or_refused(
    proxied_api: httpx.AsyncClient, proxy: FaultProxy, engine: AsyncEngine
):
    # Cut the path while submissions are in flight: every 201 must be stored;
    # a 503 may or may not have been committed, and a retry with its key settles it.
    api = proxied_api
    keys = [f"k{i}" for i in range(20)]

    async def submit(key: str) -> httpx.Response:
        return await api.post("/jobs", json={"type": "sleep"}, headers={"Idempotency-Key": key})

    await api.post("/jobs", json={"type": "sleep"})  # one pooled connection, before the fault
    proxy.add_latency(0.05)  # every round trip slow: the cut lands mid-request
    tasks = [asyncio.create_task(submit(key)) for key in keys]
    await asyncio.sleep(0.2)
    proxy.refuse()
    proxy.cut()
    first = await asyncio.gather(*tasks)
    codes = [r.status_code for r in first]
    assert set(codes) <= {201, 503} and 503 in codes, codes
    proxy.pass_through()
    await _recovers(api)
    retried = [await submit(key) for key in keys]
    assert all(r.status_code in (200, 201) for r in retried)
    for before, after in zip(first, retried, strict=True):
        if before.status_code == 201:
            assert after.status_code == 200 and after.json()["id"] == before.json()["id"]
    assert await job_count(engine) == len(keys) + 2  # + the job before and the one after


def test_only_outage_errors_count_as_unavailable():
    orig = Exception("x")
    assert is_unavailable(ConnectionRefusedError())
    assert is_unavailable(TimeoutError())
    assert is_unavailable(sa.exc.TimeoutError())
    assert is_unavailable(sa.exc.OperationalError("s", {}, orig))
    assert is_unavailable(sa.exc.InterfaceError("s", {}, orig))
    assert is_unavailable(sa.exc.DBAPIError("s", {}, orig))
    assert not is_unavailable(sa.exc.IntegrityError("s", {}, orig))
    assert not is_unavailable(sa.exc.DataError("s", {}, orig))
    assert not is_unavailable(sa.exc.ProgrammingError("s", {}, orig))
    assert not is_unavailable(RuntimeError())
    assert not is_unavailable(ValueError())
