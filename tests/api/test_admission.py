"""Admission control (MAX_PENDING): a full queue refuses new jobs with 429 and writes nothing,
replays still answer 200, depths are read at most once per refresh period, and refusals are
counted in jobs_rejected_total{reason}."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import store
from jobcore.errors import ConfigError
from jobcore.ids import new_id
from jobcore.rows import NewJob
from jobcore.settings import load_api_settings, parse_max_pending
from jobqueue_api.admission import REFRESH
from jobqueue_api.database import REQUEST_DEADLINE
from jobqueue_api.openapi import document
from jobqueue_api.state import state_of
from tests.api.conftest import MakeApi, app_of, job_count
from tests.faultproxy import FaultProxy


async def _pending(engine: AsyncEngine, queue: str) -> int:
    async with engine.connect() as conn:
        query = "SELECT count(*) FROM jobqueue.jobs WHERE queue = :q AND status = 'pending'"
        return int(await conn.scalar(sa.text(query), {"q": queue}) or 0)


async def _post(api: httpx.AsyncClient, queue: str = "default", **headers: str) -> httpx.Response:
    return await api.post("/jobs", json={"type": "sleep", "queue": queue}, headers=headers)


async def _fill(api: httpx.AsyncClient, queue: str, n: int) -> None:
    for _ in range(n):
        assert (await _post(api, queue)).status_code == 201


def _assert_refused(response: httpx.Response, queue: str) -> None:
    assert response.status_code == 429, response.text
    assert response.headers["retry-after"] == "1"
    assert set(response.json()) == {"error"}
    assert repr(queue) in response.json()["error"] and "MAX_PENDING" in response.json()["error"]


async def _rejected(api: httpx.AsyncClient) -> dict[str, float]:
    text = (await api.get("/metrics")).text
    return {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "jobs_rejected_total"
    }


# --- settings -------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, parsed",
    [
        ("", ({}, None)),
        ("100000", ({}, 100000)),
        ("default:100000,bulk:1000000", ({"default": 100000, "bulk": 1000000}, None)),
        (" 500 , bulk:10", ({"bulk": 10}, 500)),
        ("bulk:10,500", ({"bulk": 10}, 500)),
    ],
)
def test_max_pending_is_a_bare_cap_per_queue_caps_or_both(value, parsed):
    assert parse_max_pending(value) == parsed
    assert load_api_settings({"MAX_PENDING": value}).max_pending == parsed


@pytest.mark.parametrize(
    "value, says",
    [
        ("0", "from 1 to"),
        ("lots", "from 1 to"),
        ("1e5", "from 1 to"),
        ("-1", "from 1 to"),
        ("1000000001", "from 1 to"),
        ("99999999999999999999999", "from 1 to"),
        ("bulk:", "of queue 'bulk'"),
        ("Bulk:5", "queue name 'Bulk'"),
        ("bulk:5,bulk:6", "listed twice"),
        ("5,6", "given twice"),
        ("default:5,", "from 1 to"),
    ],
)
def test_invalid_max_pending_names_the_variable(value, says):
    with pytest.raises(ConfigError) as caught:
        load_api_settings({"MAX_PENDING": value})
    assert caught.value.variable == "MAX_PENDING"
    assert says in str(caught.value)


def test_without_max_pending_there_is_no_admission_control_and_no_429_documented():
    assert load_api_settings({}).max_pending == ({}, None)
    doc = document(["sleep"], auth=False, default_max_attempts=5)
    for path in ("/jobs", "/jobs/batch"):
        assert "429" not in doc["paths"][path]["post"]["responses"]


def test_the_document_shows_429_with_retry_after_on_both_create_endpoints_when_capped():
    doc = document(["sleep"], auth=False, default_max_attempts=5, admission=True)
    for path in ("/jobs", "/jobs/batch"):
        refused = doc["paths"][path]["post"]["responses"]["429"]
        assert refused["content"]["application/json"]["schema"]["$ref"].endswith("/Error")
        assert "Retry-After" in refused["headers"]


async def test_an_app_without_max_pending_has_no_admission_control(make_api: MakeApi):
    api = await make_api()
    assert state_of(app_of(api)).admission is None
    assert "429" not in state_of(app_of(api)).openapi["paths"]["/jobs"]["post"]["responses"]


# --- refusals -------------------------------------------------------------------


async def test_a_full_queue_refuses_a_new_job_with_429_and_retry_after_and_writes_nothing(
    make_api: MakeApi, engine: AsyncEngine
):
    api = await make_api(MAX_PENDING="3")
    await _fill(api, "default", 3)
    _assert_refused(await _post(api), "default")
    _assert_refused(await _post(api, **{"Idempotency-Key": "fresh-key"}), "default")
    assert await job_count(engine) == 3
    assert "429" in state_of(app_of(api)).openapi["paths"]["/jobs"]["post"]["responses"]


async def test_other_queues_are_unaffected_by_a_full_one(make_api: MakeApi, engine: AsyncEngine):
    # A bare number caps every queue on its own; a listed queue has its own cap; without a
    # bare number, queues not listed have no cap.
    api = await make_api(MAX_PENDING="2,bulk:4")
    await _fill(api, "default", 2)
    _assert_refused(await _post(api), "default")
    await _fill(api, "mail", 2)
    _assert_refused(await _post(api, "mail"), "mail")
    await _fill(api, "bulk", 4)
    _assert_refused(await _post(api, "bulk"), "bulk")

    listed_only = await make_api(MAX_PENDING="default:2")
    _assert_refused(await _post(listed_only), "default")
    await _fill(listed_only, "other", 5)
    assert await job_count(engine) == 2 + 2 + 4 + 5


async def test_a_batch_adding_to_a_full_queue_is_refused_whole(
    make_api: MakeApi, engine: AsyncEngine
):
    api = await make_api(MAX_PENDING="default:2")
    await _fill(api, "default", 2)
    batch = {
        "jobs": [
            {"type": "sleep", "queue": "other"},
            {"type": "sleep", "queue": "other", "idempotency_key": "b-1"},
            {"type": "sleep", "queue": "default", "idempotency_key": "b-2"},
        ]
    }
    _assert_refused(await api.post("/jobs/batch", json=batch), "default")
    assert await job_count(engine) == 2
    assert "429" in state_of(app_of(api)).openapi["paths"]["/jobs/batch"]["post"]["responses"]
    # Without the full queue's item, the same batch is admitted.
    ok = await api.post("/jobs/batch", json={"jobs": batch["jobs"][:2]})
    assert ok.status_code == 200
    assert [r["status"] for r in ok.json()["results"]] == ["created", "created"]


async def test_a_batch_is_admitted_below_the_cap_and_its_jobs_count_at_once(
    make_api: MakeApi, engine: AsyncEngine
):
    api = await make_api(MAX_PENDING="5")
    batch = {"jobs": [{"type": "sleep"}] * 4}
    assert (await api.post("/jobs/batch", json=batch)).status_code == 200
    # 4 of 5: admitted, and it may take the queue past its cap (checked before, not after).
    assert (await api.post("/jobs/batch", json=batch)).status_code == 200
    # This process counts what it created without waiting for the next read of the depths.
    _assert_refused(await _post(api), "default")
    assert await job_count(engine) == 8


async def test_requests_in_flight_hold_their_places_so_one_process_overshoots_by_one_at_most(
    make_api: MakeApi, engine: AsyncEngine
):
    api = await make_api(MAX_PENDING="10")
    batch = {"jobs": [{"type": "sleep"}] * 500}
    answers = await asyncio.gather(*(api.post("/jobs/batch", json=batch) for _ in range(5)))
    assert sorted(r.status_code for r in answers) == [200, 429, 429, 429, 429]
    assert await _pending(engine, "default") == 500


async def test_a_request_without_an_answer_keeps_its_places_until_the_depths_are_read_again(
    make_api: MakeApi, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
):
    """Its jobs may have been written (a statement whose answer was lost can still commit),
    so they count until the next read of the depths says what is really there."""
    from jobqueue_api import jobs as endpoints

    api = await make_api(MAX_PENDING="2")
    real = endpoints.submit_many

    async def broken(*args: Any) -> Any:
        raise ConnectionResetError("the database went away")

    monkeypatch.setattr(endpoints, "submit_many", broken)
    batch = {"jobs": [{"type": "sleep"}] * 2}
    assert (await api.post("/jobs/batch", json=batch)).status_code >= 500
    monkeypatch.setattr(endpoints, "submit_many", real)
    _assert_refused(await api.post("/jobs/batch", json=batch), "default")
    await asyncio.sleep(REFRESH)  # the read finds nothing pending: the places are free again
    assert (await api.post("/jobs/batch", json=batch)).status_code == 200
    _assert_refused(await _post(api), "default")
    assert await _pending(engine, "default") == 2


async def test_a_full_queue_stays_full_while_its_depth_is_read_again(
    make_api: MakeApi, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
):
    read = store.pending_depths
    slow = asyncio.Event()
    slow.set()

    async def reading(*args: Any) -> Any:
        await slow.wait()
        return await read(*args)

    monkeypatch.setattr(store, "pending_depths", reading)
    api = await make_api(MAX_PENDING="2")
    await _fill(api, "default", 2)
    _assert_refused(await _post(api), "default")
    await asyncio.sleep(REFRESH)  # the depths are due for a read
    slow.clear()  # which now takes until the submissions below are answered
    rereading = asyncio.create_task(_post(api))
    answers = await asyncio.gather(*(_post(api) for _ in range(8)))
    slow.set()
    answers.append(await rereading)
    assert [r.status_code for r in answers] == [429] * 9
    assert await _pending(engine, "default") == 2


async def test_a_replay_of_a_stored_job_is_still_200_while_its_queue_is_full(
    make_api: MakeApi, engine: AsyncEngine
):
    api = await make_api(MAX_PENDING="2")
    first = await _post(api, **{"Idempotency-Key": "k-1"})
    assert first.status_code == 201
    await _fill(api, "default", 1)
    replay = await _post(api, **{"Idempotency-Key": "k-1"})
    assert replay.status_code == 200 and replay.json() == first.json()
    # The key names a job, but not this request: the usual 409, not a 429.
    other = await api.post(
        "/jobs", json={"type": "sleep", "priority": 3}, headers={"Idempotency-Key": "k-1"}
    )
    assert other.status_code == 409
    _assert_refused(await _post(api, **{"Idempotency-Key": "k-2"}), "default")

    replays = {"jobs": [{"type": "sleep", "idempotency_key": "k-1"}] * 2}
    answer = await api.post("/jobs/batch", json=replays)
    assert answer.status_code == 200
    assert answer.json()["results"] == [{"status": "replayed", "id": first.json()["id"]}] * 2
    mixed = {"jobs": [*replays["jobs"], {"type": "sleep", "idempotency_key": "k-3"}]}
    _assert_refused(await api.post("/jobs/batch", json=mixed), "default")
    assert await job_count(engine) == 2


async def test_jobs_written_by_others_and_scheduled_jobs_count_toward_the_cap(
    make_api: MakeApi, engine: AsyncEngine
):
    api = await make_api(MAX_PENDING="50")
    assert (await _post(api)).status_code == 201  # the depths are read now: none pending
    # Another writer adds 49 jobs, 48 of them due only in an hour: the queue is full.
    async with engine.begin() as conn:
        for i in range(49):
            delay = 0.0 if i == 0 else 3600.0
            new = NewJob(id=new_id(), type="sleep", payload={}, max_attempts=1, delay=delay)
            await store.submit(conn, new)
    started = time.monotonic()
    created = 1
    while (response := await _post(api)).status_code == 201:
        created += 1
        assert time.monotonic() - started < REFRESH + 3, "the other writer's jobs never counted"
        await asyncio.sleep(0.05)
    _assert_refused(response, "default")
    # Refused because the next read saw the other writer's jobs, long before this
    # process's own count of what it created could reach the cap.
    assert created < 30
    assert await _pending(engine, "default") == 49 + created


async def test_a_queue_admits_again_within_the_refresh_period_after_it_drains(
    make_api: MakeApi, engine: AsyncEngine
):
    api = await make_api(MAX_PENDING="2")
    await _fill(api, "default", 2)
    _assert_refused(await _post(api), "default")
    async with engine.begin() as conn:
        await conn.execute(sa.text("UPDATE jobqueue.jobs SET status = 'completed'"))
    drained = time.monotonic()
    while (response := await _post(api)).status_code == 429:
        assert time.monotonic() - drained < REFRESH + 2, "still refused long after draining"
        await asyncio.sleep(0.05)
    assert response.status_code == 201
    assert await _pending(engine, "default") == 1


async def test_depths_are_read_once_per_refresh_period_not_per_request(
    make_api: MakeApi, monkeypatch: pytest.MonkeyPatch
):
    reads = 0
    read = store.pending_depths

    async def counted(*args: Any) -> Any:
        nonlocal reads
        reads += 1
        return await read(*args)

    monkeypatch.setattr(store, "pending_depths", counted)
    api = await make_api(MAX_PENDING="1000")
    started = time.monotonic()
    responses = await asyncio.gather(*(_post(api) for _ in range(40)))
    await _fill(api, "default", 20)
    elapsed = time.monotonic() - started
    assert all(r.status_code == 201 for r in responses)
    assert 1 <= reads <= 1 + int(elapsed / REFRESH)


async def test_in_a_database_outage_the_depth_check_adds_no_wait_to_the_503(
    make_api: MakeApi, database_url: str
):
    with FaultProxy.to_database(database_url) as proxy:
        api = await make_api(DATABASE_URL=proxy.database_url(database_url), MAX_PENDING="100")
        assert (await _post(api)).status_code == 201
        await asyncio.sleep(REFRESH)  # the depths are due for a read
        proxy.blackhole()
        started = time.monotonic()
        batch = api.post("/jobs/batch", json={"jobs": [{"type": "sleep"}]})
        answers = await asyncio.gather(batch, *(_post(api) for _ in range(6)))
        took = time.monotonic() - started
        assert [r.status_code for r in answers] == [503] * 7
        # One request reads the depths and then inserts, all within one request deadline;
        # the others neither queue behind that read nor read again one after another.
        assert took < REQUEST_DEADLINE + 2.5, f"took {took:.1f}s"
        proxy.pass_through()
        deadline = time.monotonic() + 10
        while (await _post(api)).status_code != 201:
            assert time.monotonic() < deadline, "not serving again after the outage"
            await asyncio.sleep(0.1)


# --- metrics --------------------------------------------------------------------


async def test_jobs_rejected_total_counts_admission_and_validation_refusals(
    make_api: MakeApi,
):
    api = await make_api(MAX_PENDING="1", MAX_BODY_BYTES="1000")
    before = await _rejected(api)
    assert set(before) == {"admission", "validation"}
    await _fill(api, "default", 1)
    assert (await _post(api)).status_code == 429
    assert (await api.post("/jobs/batch", json={"jobs": [{"type": "sleep"}]})).status_code == 429
    assert (await api.post("/jobs", json={"type": "nope"})).status_code == 400
    assert (await api.post("/jobs/batch", json={"jobs": []})).status_code == 400
    big = {"type": "sleep", "queue": "other", "payload": "x" * 2000}
    assert (await api.post("/jobs", json=big)).status_code == 413
    # Neither a replay nor a conflict nor a read is a refusal.
    assert (await _post(api, "other", **{"Idempotency-Key": "m"})).status_code == 201
    assert (await _post(api, "other", **{"Idempotency-Key": "m"})).status_code == 200
    assert (await api.get("/jobs/nope")).status_code == 404
    after = await _rejected(api)
    assert after["admission"] - before["admission"] == 2
    assert after["validation"] - before["validation"] == 3


async def test_between_sweeps_the_depths_are_read_from_where_the_last_read_found_them(
    make_api: MakeApi, monkeypatch: pytest.MonkeyPatch
):
    """Under a held MVCC horizon a read from the head would visit every claimed job's dead
    entry (`jobcore.floors.CountFloors`, docs/pressure.md#counts)."""
    sweeps: list[bool] = []
    read = store.pending_depths

    async def recorded(*args: Any) -> Any:
        sweeps.append(args[-1])
        return await read(*args)

    monkeypatch.setattr(store, "pending_depths", recorded)
    api = await make_api(MAX_PENDING="1000")
    await _fill(api, "default", 1)
    admission = state_of(app_of(api)).admission
    assert admission is not None and sweeps == [True]
    admission.floors.sweeps.done(time.monotonic(), time.monotonic() + 10)  # a costly sweep
    deadline = time.monotonic() + 5 * REFRESH
    while len(sweeps) < 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(REFRESH / 10)
        await _fill(api, "default", 1)
    assert sweeps == [True, False]
    assert admission.floors.params(sweep=False)["known_queues"] == ["default"]
