"""A job's `concurrency_key` through the API: POST /jobs and /jobs/batch take it (1–255
characters, no control characters, default null) or refuse it with a 400 naming the field
and writing nothing; the record shows it wherever the API answers with a job; an idempotent
replay compares it like the other fields."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore.ids import new_id
from jobcore.rows import NewJob
from jobcore.schema import jobs
from jobqueue_api import calls
from jobqueue_api.database import on_driver, open_engine
from tests.api.conftest import job_count

# A value of each kind the field refuses, and what the message says of it.
BAD_KEYS: dict[str, tuple[Any, str]] = {
    "null": (None, "must be a string"),
    "a number": (7, "must be a string"),
    "a boolean": (True, "must be a string"),
    "a list": (["a"], "must be a string"),
    "an object": ({"k": "a"}, "must be a string"),
    "empty": ("", "1 to 255 characters, got 0"),
    "too long": ("k" * 256, "1 to 255 characters, got 256"),
    "too long in characters, not bytes": ("é" * 256, "got 256"),
    "a tab": ("a\tb", "control characters (found U+0009 at index 1)"),
    "a newline": ("tenant\n", "control characters (found U+000A"),
    "DEL": ("a\x7fb", "control characters (found U+007F"),
    "a C1 control": ("a\x85b", "control characters (found U+0085"),
    "a line separator": ("a\u2028b", "control characters (found U+2028"),
}
# At the limits, and text an idempotency key could not hold.
GOOD_KEYS = ["k", "k" * 255, "é" * 255, "tenant 42/eu ", " lead", "клиент-7", "😀" * 255, "~"]


async def _stored_keys(engine: AsyncEngine) -> list[str | None]:
    async with engine.connect() as conn:
        found = await conn.execute(sa.select(jobs.c.concurrency_key).order_by(jobs.c.id))
        return list(found.scalars())


async def test_a_bad_concurrency_key_is_a_400_naming_the_field_and_writes_nothing(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    failures = []
    for case, (key, expected) in BAD_KEYS.items():
        item = {"type": "sleep", "concurrency_key": key}
        single = await api.post("/jobs", json=item)
        batch = await api.post("/jobs/batch", json={"jobs": [{"type": "sleep"}, item]})
        for name, r, prefix in (("POST /jobs", single, ""), ("batch", batch, "[1] ")):
            message = r.json().get("error", "") if r.status_code == 400 else ""
            if f"{prefix}field 'concurrency_key' " not in message or expected not in message:
                failures.append(f"{case} ({name}): {r.status_code} {r.text[:200]}")
    assert failures == []
    assert await job_count(engine) == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [("a\\u0000b", "\\u0000 (found at $.concurrency_key)"), ("a\\ud800", "surrogate")],
)
async def test_a_key_no_text_column_can_hold_is_a_400_naming_where_it_is(
    api: httpx.AsyncClient, engine: AsyncEngine, text: str, expected: str
):
    body = b'{"type": "sleep", "concurrency_key": "' + text.encode() + b'"}'
    r = await api.post("/jobs", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and expected in r.json()["error"], r.text
    assert "concurrency_key" in r.json()["error"]
    assert await job_count(engine) == 0


async def test_keys_of_1_to_255_characters_without_controls_are_stored_as_given(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    for key in GOOD_KEYS:
        r = await api.post("/jobs", json={"type": "sleep", "concurrency_key": key})
        assert r.status_code == 201, (key, r.text)
        assert r.json()["concurrency_key"] == key
    assert await _stored_keys(engine) == GOOD_KEYS


async def test_the_record_shows_the_key_on_create_read_list_and_control_answers(
    api: httpx.AsyncClient,
):
    created = await api.post("/jobs", json={"type": "sleep", "concurrency_key": "tenant-7"})
    plain = await api.post("/jobs", json={"type": "sleep"})
    assert created.status_code == 201 and plain.status_code == 201
    job_id, plain_id = created.json()["id"], plain.json()["id"]
    assert created.json()["concurrency_key"] == "tenant-7"
    assert plain.json()["concurrency_key"] is None  # the default: no key
    read = (await api.get(f"/jobs/{job_id}")).json()
    assert read["concurrency_key"] == "tenant-7"
    assert (await api.get(f"/jobs/{plain_id}")).json()["concurrency_key"] is None
    listed = {job["id"]: job for job in (await api.get("/jobs")).json()["jobs"]}
    assert listed[job_id]["concurrency_key"] == "tenant-7"
    assert listed[plain_id]["concurrency_key"] is None
    cancelled = await api.post(f"/jobs/{job_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["concurrency_key"] == "tenant-7"
    retried = await api.post(f"/jobs/{job_id}/retry")
    assert retried.status_code == 200 and retried.json()["concurrency_key"] == "tenant-7"


async def test_a_batch_stores_each_items_own_key(api: httpx.AsyncClient):
    keys = ["a", None, "b", "a", None]
    items = [
        {"type": "sleep"} if key is None else {"type": "sleep", "concurrency_key": key}
        for key in keys
    ]
    for keyed in (False, True):  # without idempotency keys, and with them
        if keyed:
            items = [{**item, "idempotency_key": f"batch-{i}"} for i, item in enumerate(items)]
        r = await api.post("/jobs/batch", json={"jobs": items})
        assert r.status_code == 200, r.text
        ids = [result["id"] for result in r.json()["results"]]
        got = [(await api.get(f"/jobs/{job_id}")).json()["concurrency_key"] for job_id in ids]
        assert got == keys, keyed


async def test_a_batch_whose_items_share_one_key_stores_it_on_every_job(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    """A value every item of a key-less batch shares is sent once: it must still reach
    every row."""
    items = [{"type": "sleep", "concurrency_key": "shared"} for _ in range(3)]
    r = await api.post("/jobs/batch", json={"jobs": items})
    assert r.status_code == 200
    assert await _stored_keys(engine) == ["shared"] * 3


async def test_concurrent_single_submits_each_keep_their_own_key(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    """Concurrent POST /jobs without an idempotency key share a statement (submit groups)."""
    keys = [None if i % 3 == 0 else f"k{i % 4}" for i in range(40)]
    items = [
        {"type": "sleep"} if key is None else {"type": "sleep", "concurrency_key": key}
        for key in keys
    ]
    answers = await asyncio.gather(*(api.post("/jobs", json=item) for item in items))
    assert [r.status_code for r in answers] == [201] * len(keys)
    assert [r.json()["concurrency_key"] for r in answers] == keys
    async with engine.connect() as conn:
        rows = await conn.execute(sa.select(jobs.c.id, jobs.c.concurrency_key))
        stored = {str(row.id): row.concurrency_key for row in rows}
    assert [stored[r.json()["id"]] for r in answers] == keys


async def test_a_submit_group_writes_each_members_key(database_url: str):
    keys = ["a", None, "b", "a"]
    news = [NewJob(new_id(), "sleep", {}, 3, concurrency_key=key) for key in keys]
    engine = open_engine(database_url)
    try:
        written = await on_driver(
            engine, lambda conn, again: calls.submit_group(conn, news), retry=False
        )
        assert [job.concurrency_key for job in written] == keys
        read = [
            await on_driver(engine, lambda conn, again, i=new.id: calls.get(conn, i), retry=False)
            for new in news
        ]
        assert [job.concurrency_key if job else "missing" for job in read] == keys
    finally:
        await engine.dispose()


@pytest.mark.parametrize("stored", ["tenant-7", None])
async def test_a_replay_with_the_same_key_is_the_job_and_another_key_is_a_conflict(
    api: httpx.AsyncClient, engine: AsyncEngine, stored: str | None
):
    def request(key: str | None) -> dict[str, Any]:
        item: dict[str, Any] = {"type": "sleep", "payload": {"n": 1}}
        return item if key is None else {**item, "concurrency_key": key}

    headers = {"Idempotency-Key": "order-42"}
    first = await api.post("/jobs", json=request(stored), headers=headers)
    assert first.status_code == 201
    again = await api.post("/jobs", json=request(stored), headers=headers)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert again.json()["concurrency_key"] == stored
    for other in ("tenant-8", "Tenant-7", None):
        if other == stored:
            continue
        conflict = await api.post("/jobs", json=request(other), headers=headers)
        assert conflict.status_code == 409, (other, conflict.text)
        assert "order-42" in conflict.json()["error"]
    batch = await api.post(
        "/jobs/batch",
        json={
            "jobs": [
                {**request(stored), "idempotency_key": "order-42"},
                {**request("tenant-9"), "idempotency_key": "order-42"},
                # Repeated inside the batch: the first item decides.
                {**request("x"), "idempotency_key": "new-1"},
                {**request("x"), "idempotency_key": "new-1"},
                {**request("y"), "idempotency_key": "new-1"},
            ]
        },
    )
    assert batch.status_code == 200
    results = batch.json()["results"]
    assert [result["status"] for result in results] == [
        "replayed",
        "conflict",
        "created",
        "replayed",
        "conflict",
    ]
    assert results[0]["id"] == first.json()["id"]
    assert await _stored_keys(engine) == [stored, "x"]
