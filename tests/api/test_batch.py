"""POST /jobs/batch (docs/api.md, "Bulk submit"): all-or-nothing validation, one statement,
per-item results."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import pytest
import sqlalchemy as sa

from jobcore.db import asyncpg_dsn
from jobcore.queries import NOTIFY_CHANNEL
from jobcore.schema import jobs
from jobcore.settings import load_api_settings
from jobqueue_api.app import create_app


@pytest.fixture
async def client(engine):
    app = create_app(load_api_settings({}), engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client


async def _rows(engine) -> int:
    async with engine.connect() as conn:
        return await conn.scalar(sa.select(sa.func.count()).select_from(jobs))


async def test_batch_creates_every_job_and_answers_in_input_order(client, engine):
    items = [{"type": "sleep", "payload": {"duration": f"{i}ms"}} for i in range(1000)]
    response = await client.post("/jobs/batch", json={"jobs": items})
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["status"] for r in results] == ["created"] * 1000
    async with engine.connect() as conn:
        stored = {str(r.id): r.payload for r in await conn.execute(sa.select(jobs))}
    assert [stored[r["id"]] for r in results] == [item["payload"] for item in items]


async def test_batch_reports_replays_and_conflicts_per_item(client, engine):
    first = await client.post(
        "/jobs", json={"type": "sleep", "payload": {"a": 1}}, headers={"Idempotency-Key": "k1"}
    )
    response = await client.post(
        "/jobs/batch",
        json={
            "jobs": [
                {"type": "sleep", "payload": {"a": 1}, "idempotency_key": "k1"},
                {"type": "sleep", "payload": {"a": 2}, "idempotency_key": "k1"},
                {"type": "sleep", "idempotency_key": "k2", "max_attempts": 2},
                {"type": "sleep", "idempotency_key": "k2", "max_attempts": 2},
            ]
        },
    )
    assert response.status_code == 200
    results = response.json()["results"]
    assert results[0] == {"status": "replayed", "id": first.json()["id"]}
    assert results[1]["status"] == "conflict" and "k1" in results[1]["error"]
    assert "id" not in results[1]
    assert results[2]["status"] == "created"
    assert results[3] == {"status": "replayed", "id": results[2]["id"]}
    assert await _rows(engine) == 2


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (
            {"jobs": [{"type": "sleep"}, {"type": "nope"}, {"type": "sleep", "x": 1}]},
            ["[1]", "[2]"],
        ),
        ({"jobs": [{"type": "sleep", "max_attempts": 0}]}, ["[0]"]),
        ({"jobs": [{"type": "sleep", "idempotency_key": ""}]}, ["[0]"]),
        ({"jobs": [{"type": "sleep", "payload": "a\u0000b"}]}, ["[0]"]),
        ({"jobs": ["sleep"]}, ["[0]"]),
        ({"jobs": []}, []),
        ({"jobs": [{"type": "sleep"}] * 1001}, []),
        ({"jobs": {"type": "sleep"}}, []),
        ({"items": []}, []),
        ([{"type": "sleep"}], []),
    ],
)
async def test_an_invalid_batch_is_rejected_whole_naming_the_items(client, engine, body, named):
    response = await client.post("/jobs/batch", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    for index in named:
        assert index in error
    assert await _rows(engine) == 0


async def test_batch_body_over_the_limit_is_413(engine):
    app = create_app(load_api_settings({"MAX_BODY_BYTES": "1000"}), engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        response = await c.post("/jobs/batch", json={"jobs": [{"type": "sleep"}] * 100})
    assert response.status_code == 413
    assert await _rows(engine) == 0


async def test_created_jobs_wake_listening_workers(client, database_url):
    listener = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        heard: list[object] = []
        await listener.add_listener(NOTIFY_CHANNEL, lambda *args: heard.append(args))
        await client.post("/jobs/batch", json={"jobs": [{"type": "sleep"}] * 10})
        await _until(lambda: len(heard) >= 1, "a NOTIFY after a batch")
        await client.post("/jobs", json={"type": "sleep"})
        await _until(lambda: len(heard) >= 2, "a NOTIFY after a single submission")
    finally:
        await listener.close()


async def _until(predicate, what: str, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)
