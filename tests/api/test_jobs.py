"""The /jobs endpoints against the real database: records, status, manual_retry, idempotency."""

from __future__ import annotations

import asyncio
import re
import uuid

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import compiled, store
from jobcore.ids import new_id
from jobcore.rows import NewJob
from jobcore.states import Operation
from tests.api.conftest import MakeApi, job_count
from tests.pg import driver

RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
JOB_FIELDS = {
    "id",
    "type",
    "payload",
    "status",
    "attempts",
    "max_attempts",
    "queue",
    "priority",
    "concurrency_key",
    "timeout",
    "run_at",
    "last_error",
    "result",
    "cancel_requested_at",
    "finished_at",
    "created_at",
    "updated_at",
}


async def _dead_lettered(engine: AsyncEngine) -> uuid.UUID:
    async with engine.begin() as conn:
        raw = await driver(conn)
        job, _ = await store.submit(conn, NewJob(new_id(), "sleep", {}, 1))
        (claimed,) = await compiled.claim(raw, {"default": 1}, 60)
        assert await compiled.record(raw, Operation.DEAD_LETTER, [claimed.lease], ["boom"]) == []
    return job.id


async def test_create_answers_201_with_the_record_and_its_location(api: httpx.AsyncClient):
    r = await api.post("/jobs", json={"type": "sleep", "payload": {"duration": "1s"}})
    assert r.status_code == 201
    job = r.json()
    assert set(job) == JOB_FIELDS
    assert r.headers["location"] == f"/jobs/{job['id']}"
    assert job["type"] == "sleep" and job["payload"] == {"duration": "1s"}
    assert job["status"] == "pending" and job["attempts"] == 0 and job["max_attempts"] == 5
    assert job["last_error"] is None
    assert job["result"] is None and job["cancel_requested_at"] is None
    assert job["finished_at"] is None
    for field in ("run_at", "created_at", "updated_at"):
        assert RFC3339_UTC.fullmatch(job[field]), job[field]


async def test_the_full_record_lists_the_failed_attempts_oldest_first(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    async with engine.begin() as conn:
        raw = await driver(conn)
        job, _ = await store.submit(conn, NewJob(new_id(), "sleep", {}, 2))
        (claimed,) = await compiled.claim(raw, {"default": 1}, 60)
        traceback = "Traceback (most recent call last):\n  ...\nValueError: boom\n"
        operation = Operation.RETRY_LATER
        await compiled.record(
            raw, operation, [claimed.lease], ["ValueError: boom"], [0.0], tracebacks=[traceback]
        )
        (claimed,) = await compiled.claim(raw, {"default": 1}, 60)
        await compiled.record(
            raw, Operation.DEAD_LETTER, [claimed.lease], ["JobTimeout: timed out after 1s"]
        )
    record = (await api.get(f"/jobs/{job.id}")).json()
    assert [(e["attempt"], e["error"], e["traceback"]) for e in record["errors"]] == [
        (1, "ValueError: boom", traceback),
        (2, "JobTimeout: timed out after 1s", None),
    ]
    assert all(RFC3339_UTC.fullmatch(e["at"]) for e in record["errors"])
    assert record["errors"][0]["at"] <= record["errors"][1]["at"]
    # Only the full record: a list leaves them out.
    (listed,) = (await api.get("/jobs")).json()["jobs"]
    assert set(listed) == JOB_FIELDS


async def test_create_defaults_payload_to_empty_object_and_honours_max_attempts(
    api: httpx.AsyncClient,
):
    r = await api.post("/jobs", json={"type": "sleep", "max_attempts": 7})
    assert r.status_code == 201
    assert r.json()["payload"] == {} and r.json()["max_attempts"] == 7


async def test_default_max_attempts_comes_from_settings(make_api: MakeApi):
    api = await make_api(MAX_ATTEMPTS="9")
    r = await api.post("/jobs", json={"type": "sleep"})
    assert r.json()["max_attempts"] == 9


async def test_any_json_value_is_a_payload(api: httpx.AsyncClient):
    for payload in (None, 3, "text", [1, {"a": [True, None]}], {"ünïcode": "✓ 😀"}):
        r = await api.post("/jobs", json={"type": "sleep", "payload": payload})
        assert r.status_code == 201, r.text
        got = await api.get(f"/jobs/{r.json()['id']}")
        assert got.json()["payload"] == payload


async def test_get_returns_the_full_record(api: httpx.AsyncClient):
    created = (await api.post("/jobs", json={"type": "sleep", "payload": {"k": 1}})).json()
    r = await api.get(f"/jobs/{created['id']}")
    assert r.status_code == 200
    # The record a create answers, and the failed attempts: none yet.
    assert r.json() == {**created, "errors": []}


async def test_status_returns_the_summary_fields(api: httpx.AsyncClient):
    created = (await api.post("/jobs", json={"type": "sleep"})).json()
    r = await api.get(f"/jobs/{created['id']}/status")
    assert r.status_code == 200
    assert r.json() == {
        k: created[k] for k in ("id", "status", "attempts", "max_attempts", "run_at", "last_error")
    }


async def test_unknown_or_malformed_id_is_404(api: httpx.AsyncClient):
    for job_id in (str(uuid.uuid4()), "not-a-uuid", "123", "%20", "' OR 1=1 --"):
        for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/status"):
            r = await api.get(path)
            assert r.status_code == 404, path
            assert "not found" in r.json()["error"]


async def test_retry_requeues_a_dead_lettered_job_with_attempts_reset(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    job_id = await _dead_lettered(engine)
    r = await api.post(f"/jobs/{job_id}/retry")
    assert r.status_code == 200
    assert r.json()["status"] == "pending" and r.json()["attempts"] == 0
    assert r.json()["last_error"] == "boom"
    # A second retry finds it pending: not retryable.
    again = await api.post(f"/jobs/{job_id}/retry")
    assert again.status_code == 409
    assert "pending" in again.json()["error"]


async def test_retry_requeues_a_failed_job_with_attempts_reset(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    async with engine.begin() as conn:
        job, _ = await store.submit(conn, NewJob(new_id(), "sleep", {}, 3))
        raw = await driver(conn)
        (claimed,) = await compiled.claim(raw, {"default": 1}, 60)
        lost = await compiled.record(raw, Operation.FAIL, [claimed.lease], ["bad input"])
        assert lost == []
    r = await api.post(f"/jobs/{job.id}/retry")
    assert r.status_code == 200
    assert (r.json()["status"], r.json()["attempts"]) == ("pending", 0)


async def test_retry_of_a_job_not_in_dead_letter_is_409_and_changes_nothing(
    api: httpx.AsyncClient,
):
    created = (await api.post("/jobs", json={"type": "sleep"})).json()
    r = await api.post(f"/jobs/{created['id']}/retry")
    assert r.status_code == 409
    assert (await api.get(f"/jobs/{created['id']}")).json() == {**created, "errors": []}


async def test_retry_of_an_unknown_job_is_404(api: httpx.AsyncClient):
    for job_id in (str(uuid.uuid4()), "nope"):
        r = await api.post(f"/jobs/{job_id}/retry")
        assert r.status_code == 404 and "error" in r.json()


# --- idempotency -------------------------------------------------------------------


async def test_same_key_and_request_replays_the_job_with_200(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    body = {"type": "sleep", "payload": {"duration": "1s"}}
    first = await api.post("/jobs", json=body, headers={"Idempotency-Key": "order-42"})
    second = await api.post("/jobs", json=body, headers={"Idempotency-Key": "order-42"})
    assert first.status_code == 201 and second.status_code == 200
    assert second.json() == first.json()
    assert "location" not in second.headers
    assert await job_count(engine) == 1


async def test_replay_compares_payloads_as_jsonb(api: httpx.AsyncClient):
    key = {"Idempotency-Key": "k-jsonb"}
    first = await api.post(
        "/jobs", content='{"type":"sleep","payload":{"a":1,"b":[1,2]}}', headers=key
    )
    same = await api.post(
        "/jobs", content='{ "payload" : { "b" : [1, 2], "a" : 1 }, "type" : "sleep" }', headers=key
    )
    assert first.status_code == 201 and same.status_code == 200
    assert same.json()["id"] == first.json()["id"]


async def test_replay_with_explicit_default_max_attempts_matches(api: httpx.AsyncClient):
    key = {"Idempotency-Key": "k-default"}
    first = await api.post("/jobs", json={"type": "sleep"}, headers=key)
    same = await api.post(
        "/jobs", json={"type": "sleep", "payload": {}, "max_attempts": 5}, headers=key
    )
    assert (first.status_code, same.status_code) == (201, 200)


@pytest.mark.parametrize(
    "different",
    [
        {"type": "webhook", "payload": {"n": 1}},
        {"type": "sleep", "payload": {"n": 2}},
        {"type": "sleep", "payload": {"n": 1}, "max_attempts": 2},
    ],
)
async def test_same_key_different_request_is_409_and_writes_nothing(
    api: httpx.AsyncClient, engine: AsyncEngine, different: dict[str, object]
):
    key = {"Idempotency-Key": "order-7"}
    first = await api.post("/jobs", json={"type": "sleep", "payload": {"n": 1}}, headers=key)
    assert first.status_code == 201
    r = await api.post("/jobs", json=different, headers=key)
    assert r.status_code == 409
    assert "order-7" in r.json()["error"]
    assert await job_count(engine) == 1
    assert (await api.get(f"/jobs/{first.json()['id']}")).json() == {**first.json(), "errors": []}


async def test_concurrent_duplicate_submissions_create_exactly_one_job(
    make_api: MakeApi, engine: AsyncEngine
):
    # Two apps with their own pools: the race is decided by PostgreSQL, not by one process.
    apis = [await make_api(), await make_api()]
    body = {"type": "sleep", "payload": {"race": True}}
    for round_ in range(3):
        key = {"Idempotency-Key": f"race-{round_}"}
        responses = await asyncio.gather(
            *(apis[i % 2].post("/jobs", json=body, headers=key) for i in range(16))
        )
        codes = sorted(r.status_code for r in responses)
        assert codes == [200] * 15 + [201], codes
        assert len({r.json()["id"] for r in responses}) == 1
    assert await job_count(engine) == 3


async def test_jobs_without_a_key_are_never_deduplicated(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    body = {"type": "sleep"}
    codes = [(await api.post("/jobs", json=body)).status_code for _ in range(3)]
    assert codes == [201, 201, 201]
    assert await job_count(engine) == 3
