"""Which types the API accepts (docs/api.md#job-types): its own handlers, JOB_TYPES, and
the types the workers recorded in `job_types` (within 7 days), each with its handler's
options as the defaults of the fields a request omits; anything else is 400 saying how to
declare it."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from jobcore import JobContext, compiled, handler
from jobcore.schema import job_types
from tests.pg import driver


@handler("test.api.types.local", queue="local-q", priority=3, max_attempts=2, timeout=90)
async def local(payload: Any, ctx: JobContext) -> None:
    return None


async def record(engine: Any, job_type: str, **options: Any) -> None:
    """Record `job_type` as a worker process does, through the worker's own call."""
    async with engine.connect() as conn:
        await compiled.record_types(
            await driver(conn), [(job_type, json.dumps(options), "[]")], "test-host:1"
        )


def routing(job: dict[str, Any]) -> tuple[Any, ...]:
    return job["queue"], job["priority"], job["max_attempts"], job["timeout"]


async def test_a_type_a_worker_recorded_a_moment_ago_is_accepted_with_its_options(api, engine):
    before = await api.post("/jobs", json={"type": "test.api.types.remote"})
    assert before.status_code == 400
    await record(engine, "test.api.types.remote", queue="mail", priority=5, timeout=60.0)
    created = await api.post("/jobs", json={"type": "test.api.types.remote"})
    assert created.status_code == 201, created.text
    assert routing(created.json()) == ("mail", 5, 5, 60.0)  # max_attempts: MAX_ATTEMPTS
    explicit = await api.post(
        "/jobs", json={"type": "test.api.types.remote", "queue": "other", "max_attempts": 1}
    )
    assert routing(explicit.json()) == ("other", 5, 1, 60.0)


async def test_an_unknown_type_is_400_saying_how_to_declare_it(api):
    refused = await api.post("/jobs", json={"type": "test.api.types.nobody"})
    assert refused.status_code == 400
    message = refused.json()["error"]
    assert "unknown job type 'test.api.types.nobody'" in message
    assert "register" in message and "worker" in message and "JOB_TYPES" in message
    batch = await api.post(
        "/jobs/batch", json={"jobs": [{"type": "sleep"}, {"type": "test.api.types.nobody"}]}
    )
    assert batch.status_code == 400 and "[1] unknown job type" in batch.json()["error"]


async def test_job_types_names_types_without_defaults(make_api):
    api = await make_api(JOB_TYPES="test.api.types.named, test.api.types.other")
    created = await api.post("/jobs", json={"type": "test.api.types.named"})
    assert created.status_code == 201, created.text
    assert routing(created.json()) == ("default", 0, 5, None)


async def test_a_local_handlers_options_are_the_defaults_of_single_and_batch_creates(api):
    single = await api.post("/jobs", json={"type": "test.api.types.local"})
    assert routing(single.json()) == ("local-q", 3, 2, 90.0)
    batch = await api.post(
        "/jobs/batch",
        json={
            "jobs": [
                {"type": "test.api.types.local"},
                {"type": "test.api.types.local", "priority": -1},
            ]
        },
    )
    assert batch.status_code == 200, batch.text
    ids = [result["id"] for result in batch.json()["results"]]
    found = [(await api.get(f"/jobs/{job_id}")).json() for job_id in ids]
    assert [routing(job) for job in found] == [("local-q", 3, 2, 90.0), ("local-q", -1, 2, 90.0)]


async def test_the_local_handlers_options_win_over_a_recorded_record(api, engine):
    await record(engine, "test.api.types.local", queue="recorded-q", priority=9)
    created = await api.post("/jobs", json={"type": "test.api.types.local"})
    assert routing(created.json()) == ("local-q", 3, 2, 90.0)


async def test_a_batch_accepts_recorded_types_with_their_options(api, engine):
    await record(engine, "test.api.types.batch", max_attempts=7)
    batch = await api.post(
        "/jobs/batch", json={"jobs": [{"type": "test.api.types.batch"}, {"type": "sleep"}]}
    )
    assert batch.status_code == 200, batch.text
    first = batch.json()["results"][0]
    assert (await api.get(f"/jobs/{first['id']}")).json()["max_attempts"] == 7


async def test_a_replay_is_compared_after_the_defaults_are_applied(api, engine):
    await record(engine, "test.api.types.replay", queue="mail")
    headers = {"Idempotency-Key": "types-replay-1"}
    first = await api.post("/jobs", json={"type": "test.api.types.replay"}, headers=headers)
    assert first.status_code == 201
    # The same request once the default is applied: a replay.
    same = await api.post(
        "/jobs", json={"type": "test.api.types.replay", "queue": "mail"}, headers=headers
    )
    assert same.status_code == 200 and same.json()["id"] == first.json()["id"]
    other = await api.post(
        "/jobs", json={"type": "test.api.types.replay", "queue": "default"}, headers=headers
    )
    assert other.status_code == 409
    batch = await api.post(
        "/jobs/batch",
        json={
            "jobs": [
                {"type": "test.api.types.replay", "idempotency_key": "types-replay-1"},
                {
                    "type": "test.api.types.replay",
                    "queue": "x",
                    "idempotency_key": "types-replay-1",
                },
            ]
        },
    )
    assert batch.status_code == 200
    statuses = [result["status"] for result in batch.json()["results"]]
    assert statuses == ["replayed", "conflict"]


async def test_a_record_not_refreshed_for_7_days_no_longer_counts(api, engine):
    await record(engine, "test.api.types.stale")
    async with engine.begin() as conn:
        await conn.execute(
            sa.update(job_types)
            .where(job_types.c.type == "test.api.types.stale")
            .values(recorded_at=sa.func.now() - sa.text("interval '7 days 1 minute'"))
        )
    refused = await api.post("/jobs", json={"type": "test.api.types.stale"})
    assert refused.status_code == 400
