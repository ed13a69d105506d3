"""GET /queues: per queue, due and scheduled pending jobs, running jobs, dead letters and the
age of the longest-due job; finished jobs are not counted."""

from __future__ import annotations

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore.states import Status
from tests.api.jobstates import in_status, submit

_DUE_SINCE = sa.text(
    "UPDATE jobqueue.jobs SET run_at = now() - make_interval(secs => :age) WHERE id = :id"
)


async def test_no_jobs_no_queues(api: httpx.AsyncClient):
    r = await api.get("/queues")
    assert r.status_code == 200
    assert r.json() == {"queues": []}


async def test_depths_count_each_status_per_queue_and_never_finished_jobs(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    # mail: 2 due (one due for 90 s), 1 scheduled, 1 running, 1 dead letter, and finished jobs.
    await submit(engine, queue="mail")
    long_due = await submit(engine, queue="mail")
    async with engine.begin() as conn:
        await conn.execute(_DUE_SINCE, {"age": 90, "id": long_due.id})
    await submit(engine, queue="mail", delay=3600)
    for status in (Status.PROCESSING, Status.DEAD_LETTER, Status.COMPLETED, Status.FAILED):
        await in_status(engine, status, queue="mail")
    await in_status(engine, Status.CANCELLED, queue="mail")
    # bulk: only scheduled; running: only a running job; done: only finished jobs.
    await submit(engine, queue="bulk", delay=60)
    await in_status(engine, Status.PROCESSING, queue="running")
    await in_status(engine, Status.COMPLETED, queue="done")

    r = await api.get("/queues")
    assert r.status_code == 200
    queues = r.json()["queues"]
    assert [q["queue"] for q in queues] == ["bulk", "done", "mail", "running"]
    by_name = {q.pop("queue"): q for q in queues}
    mail_age = by_name["mail"].pop("oldest_pending_age_seconds")
    assert 90 <= mail_age < 120
    assert by_name["mail"] == {
        "pending": 2,
        "scheduled": 1,
        "processing": 1,
        "dead_letter": 1,
        "paused": False,
    }
    zero = {"pending": 0, "scheduled": 0, "processing": 0, "dead_letter": 0, "paused": False}
    assert by_name["bulk"] == {**zero, "scheduled": 1, "oldest_pending_age_seconds": 0}
    assert by_name["running"] == {**zero, "processing": 1, "oldest_pending_age_seconds": 0}
    # A queue that holds only finished jobs is still known, with nothing waiting in it.
    assert by_name["done"] == {**zero, "oldest_pending_age_seconds": 0}


@pytest.mark.parametrize("query", ["queue=mail", "x=1"])
async def test_queues_takes_no_query_parameters(api: httpx.AsyncClient, query: str):
    r = await api.get(f"/queues?{query}")
    assert r.status_code == 400
    assert "unknown query parameter" in r.json()["error"]
