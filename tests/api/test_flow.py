"""POST /queues/{queue}/pause|resume and the bulk actions POST /jobs/cancel|retry: answers,
idempotence, validation (400 and nothing written), GET /queues' `paused`, and API_TOKENS."""

from __future__ import annotations

import uuid

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore.schema import jobs
from jobcore.states import Status
from tests.api.jobstates import in_status, submit


async def _queues(api: httpx.AsyncClient) -> dict:
    r = await api.get("/queues")
    assert r.status_code == 200
    return {q["queue"]: q for q in r.json()["queues"]}


async def test_pause_and_resume_are_idempotent_and_shown_by_get_queues(api, engine):
    await submit(engine, queue="mail")
    for _ in range(2):
        r = await api.post("/queues/empty/pause")
        assert (r.status_code, r.json()) == (200, {"queue": "empty", "paused": True})
    r = await api.post("/queues/mail/pause")
    assert (r.status_code, r.json()) == (200, {"queue": "mail", "paused": True})
    queues = await _queues(api)
    # A paused queue without jobs is listed while paused.
    assert queues["empty"] == {
        "queue": "empty",
        "pending": 0,
        "scheduled": 0,
        "processing": 0,
        "dead_letter": 0,
        "oldest_pending_age_seconds": 0,
        "paused": True,
    }
    assert queues["mail"]["paused"] is True and queues["mail"]["pending"] == 1
    for _ in range(2):
        r = await api.post("/queues/empty/resume")
        assert (r.status_code, r.json()) == (200, {"queue": "empty", "paused": False})
    await api.post("/queues/mail/resume")
    queues = await _queues(api)
    assert list(queues) == ["mail"] and queues["mail"]["paused"] is False
    # Submissions to a paused queue are still accepted.
    await api.post("/queues/mail/pause")
    r = await api.post("/jobs", json={"type": "sleep", "payload": {}, "queue": "mail"})
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("name", ["Upper", "-x", "a" * 64, "a%20b", "%C3%A9"])
async def test_a_bad_queue_name_is_400_and_nothing_is_paused(api, name):
    for action in ("pause", "resume"):
        r = await api.post(f"/queues/{name}/{action}")
        assert r.status_code == 400, r.text
        assert "error" in r.json()
    assert await _queues(api) == {}


async def test_pause_and_bulk_actions_are_behind_api_tokens(make_api):
    api = await make_api(API_TOKENS="secret")
    for path, body in (
        ("/queues/q/pause", None),
        ("/queues/q/resume", None),
        ("/jobs/cancel", {"queue": "q"}),
        ("/jobs/retry", {"queue": "q"}),
    ):
        r = await api.post(path, json=body)
        assert r.status_code == 401, path
        r = await api.post(path, json=body, headers={"Authorization": "Bearer secret"})
        assert r.status_code == 200, (path, r.text)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b"{}",
        b'{"limit": 5}',
        b'{"queue": "q", "unknown": 1}',
        b'{"status": "bogus"}',
        b'{"ids": ["nope"]}',
        b'{"queue": "q", "limit": 0}',
        b'{"queue": "q", "limit": 10001}',
    ],
)
async def test_malformed_bulk_filters_are_400_and_change_nothing(api, engine, body):
    job = await in_status(engine, Status.DEAD_LETTER, queue="q")
    for path in ("/jobs/cancel", "/jobs/retry"):
        r = await api.post(path, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (path, r.text)
        assert "error" in r.json()
    async with engine.connect() as conn:
        status = (await conn.execute(sa.select(jobs.c.status))).scalar_one()
    assert status == Status.DEAD_LETTER.value and job.id


async def test_too_many_ids_is_400(api):
    ids = [str(uuid.uuid4()) for _ in range(1001)]
    r = await api.post("/jobs/cancel", json={"ids": ids})
    assert r.status_code == 400
    r = await api.post("/jobs/cancel", json={"ids": ids[:1000]})
    assert r.json() == {"cancelled": 0, "cancel_requested": 0, "more": False}


async def test_bulk_cancel_and_retry_answer_their_counts(api, engine: AsyncEngine):
    for _ in range(3):
        await in_status(engine, Status.DEAD_LETTER, queue="q")
    await in_status(engine, Status.PROCESSING, queue="q")
    await submit(engine, queue="q")
    await in_status(engine, Status.COMPLETED, queue="q")
    await submit(engine, queue="other")
    r = await api.post("/jobs/cancel", json={"queue": "q", "status": "dead_letter,pending"})
    assert r.json() == {"cancelled": 4, "cancel_requested": 0, "more": False}
    r = await api.post("/jobs/cancel", json={"queue": "q"})
    assert r.json() == {"cancelled": 0, "cancel_requested": 1, "more": False}
    r = await api.post("/jobs/cancel", json={"queue": "q"})
    assert r.json() == {"cancelled": 0, "cancel_requested": 0, "more": False}
    r = await api.post("/jobs/retry", json={"status": ["cancelled"], "limit": 3})
    assert r.json() == {"retried": 3, "more": True}
    r = await api.post("/jobs/retry", json={"status": ["cancelled"], "limit": 3})
    assert r.json() == {"retried": 1, "more": False}
    async with engine.connect() as conn:
        rows = (await conn.execute(sa.select(jobs.c.queue, jobs.c.status))).all()
    assert sorted(rows) == sorted(
        [("q", "pending")] * 4 + [("q", "processing"), ("q", "completed"), ("other", "pending")]
    )
