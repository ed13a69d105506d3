"""POST /jobs/{id}/cancel: at once when no worker holds the job, by request when one does;
409 once the job has finished; and POST /jobs/{id}/retry of a cancelled job."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore.control import CANCEL_CHANNEL
from jobcore.db import asyncpg_dsn
from jobcore.states import Status
from tests.api.conftest import LogCapture
from tests.api.jobstates import get, in_status, submit, take
from tests.api.test_jobs import RFC3339_UTC


async def _cancelled_total(api: httpx.AsyncClient) -> float:
    text = (await api.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "jobs_cancelled_total":
                return sample.value
    raise AssertionError("jobs_cancelled_total is not exported")


async def test_a_pending_job_is_cancelled_at_once_with_200_and_counted(
    api: httpx.AsyncClient, engine: AsyncEngine, captured_logs: LogCapture
):
    job = await submit(engine)
    before = await _cancelled_total(api)
    r = await api.post(f"/jobs/{job.id}/cancel")
    assert r.status_code == 200, r.text
    record = r.json()
    assert record["status"] == "cancelled"
    assert RFC3339_UTC.fullmatch(record["finished_at"])
    assert record["cancel_requested_at"] is None
    assert (await api.get(f"/jobs/{job.id}")).json() == {**record, "errors": []}
    assert await _cancelled_total(api) == before + 1
    (line,) = [line for line in captured_logs.lines() if line["msg"] == "job cancelled"]
    assert line["job_id"] == str(job.id)


async def test_a_dead_lettered_job_is_cancelled_at_once(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    job = await in_status(engine, Status.DEAD_LETTER)
    r = await api.post(f"/jobs/{job.id}/cancel")
    assert (r.status_code, r.json()["status"]) == (200, "cancelled")
    assert r.json()["last_error"] == "boom"


async def test_a_running_job_is_asked_to_stop_with_202_and_its_worker_is_told(
    api: httpx.AsyncClient,
    engine: AsyncEngine,
    database_url: str,
    captured_logs: LogCapture,
):
    job = await submit(engine)
    await take(engine, job.id)
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await listener.add_listener(CANCEL_CHANNEL, lambda *args: heard.put_nowait(args[3]))
        before = await _cancelled_total(api)
        first = await api.post(f"/jobs/{job.id}/cancel")
        assert first.status_code == 202, first.text
        assert first.json()["status"] == "processing"
        asked = first.json()["cancel_requested_at"]
        assert RFC3339_UTC.fullmatch(asked)
        assert await asyncio.wait_for(heard.get(), 5) == str(job.id)
        # Asking again is 202 again, keeps the first time, and tells the worker again.
        again = await api.post(f"/jobs/{job.id}/cancel")
        assert again.status_code == 202
        assert again.json()["cancel_requested_at"] == asked
        assert await asyncio.wait_for(heard.get(), 5) == str(job.id)
    finally:
        await listener.close()
    # Only the worker ends the attempt: nothing is counted here.
    assert await _cancelled_total(api) == before
    assert (await get(engine, job.id)).status is Status.PROCESSING
    requested = [line for line in captured_logs.lines() if line["msg"] == "cancel requested"]
    assert [line["job_id"] for line in requested] == [str(job.id)] * 2


async def test_a_finished_job_cannot_be_cancelled_409_names_its_status(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    for status in (Status.COMPLETED, Status.FAILED, Status.CANCELLED):
        job = await in_status(engine, status)
        before = (await api.get(f"/jobs/{job.id}")).json()
        r = await api.post(f"/jobs/{job.id}/cancel")
        assert r.status_code == 409, status
        assert f"is {status.value}" in r.json()["error"]
        assert (await api.get(f"/jobs/{job.id}")).json() == before


async def test_cancel_of_an_unknown_or_malformed_id_is_404(api: httpx.AsyncClient):
    for job_id in (str(uuid.uuid4()), "not-a-uuid"):
        r = await api.post(f"/jobs/{job_id}/cancel")
        assert r.status_code == 404 and "not found" in r.json()["error"]


async def test_a_cancelled_job_can_be_retried_with_attempts_reset(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    job = await in_status(engine, Status.CANCELLED)
    assert job.attempts == 1
    r = await api.post(f"/jobs/{job.id}/retry")
    assert r.status_code == 200, r.text
    record = r.json()
    assert (record["status"], record["attempts"]) == ("pending", 0)
    assert record["finished_at"] is None and record["cancel_requested_at"] is None


async def test_retry_of_a_running_or_completed_job_is_409_naming_what_can_be_retried(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    for status in (Status.PROCESSING, Status.COMPLETED):
        job = await in_status(engine, status)
        r = await api.post(f"/jobs/{job.id}/retry")
        assert r.status_code == 409
        assert r.json()["error"] == (
            f"job {job.id} is {status.value}; only cancelled, dead_letter or failed jobs "
            "can be retried"
        )
