"""GET /jobs: filters, limits, refusals, and keyset pages that neither skip nor repeat a job
while jobs are being inserted."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import store
from jobcore.ids import new_id
from jobcore.rows import NewJob
from jobcore.search import DEFAULT_LIMIT, MAX_LIMIT
from jobcore.states import Status
from jobqueue_api.validation import encode_cursor
from tests.api.conftest import job_count
from tests.api.jobstates import in_status

_SET_STATUS = sa.text(
    "UPDATE jobqueue.jobs SET status = :status, finished_at = CASE WHEN :finished THEN now() END, "
    "locked_until = CASE WHEN :status = 'processing' THEN now() + interval '1 hour' END "
    "WHERE id = ANY(:ids)"
)


async def _many(engine: AsyncEngine, n: int, **fields: Any) -> list[UUID]:
    """`n` pending jobs, oldest first."""
    batch = [NewJob(new_id(), fields.pop("type", "sleep"), {}, 3, **fields)]
    batch += [NewJob(new_id(), batch[0].type, {}, 3, **fields) for _ in range(n - 1)]
    async with engine.begin() as conn:
        await store.submit_many(conn, batch)
    return [new.id for new in batch]


async def _set_status(engine: AsyncEngine, ids: list[UUID], status: Status) -> None:
    """Bulk set-up for listing only: the statuses as rows, not as transitions."""
    finished = status not in (Status.PENDING, Status.PROCESSING)
    async with engine.begin() as conn:
        await conn.execute(_SET_STATUS, {"status": status.value, "finished": finished, "ids": ids})


async def _ids(api: httpx.AsyncClient, query: str) -> list[str]:
    r = await api.get(f"/jobs?{query}")
    assert r.status_code == 200, r.text
    return [job["id"] for job in r.json()["jobs"]]


def _newest_first(ids: list[UUID]) -> list[str]:
    return [str(job_id) for job_id in sorted(ids, reverse=True)]


async def test_an_empty_table_lists_no_jobs_and_no_cursor(api: httpx.AsyncClient):
    r = await api.get("/jobs")
    assert r.status_code == 200
    assert r.json() == {"jobs": [], "next_cursor": None}


async def test_jobs_are_listed_newest_first_as_records_without_their_failed_attempts(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    done = await in_status(engine, Status.COMPLETED)
    created = [(await api.post("/jobs", json={"type": "sleep"})).json() for _ in range(3)]
    r = await api.get("/jobs")
    listed = r.json()["jobs"]
    assert listed[:3] == created[::-1]
    # The full record less its failed attempts, which only GET /jobs/{id} carries.
    full = (await api.get(f"/jobs/{done.id}")).json()
    assert full.pop("errors") == [] and listed[3] == full
    assert r.json()["next_cursor"] is None


async def test_each_filter_and_their_combinations_select_exactly_the_matching_jobs(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    jobs: dict[tuple[str, str, Status], list[UUID]] = {}
    for job_type in ("sleep", "report"):  # a type need not be registered to be listed
        for queue in ("default", "mail"):
            for status in Status:
                ids = await _many(engine, 2, type=job_type, queue=queue)
                await _set_status(engine, ids, status)
                jobs[(job_type, queue, status)] = ids

    def expected(types: set[str], queues: set[str], statuses: set[Status]) -> list[str]:
        return _newest_first(
            [
                job_id
                for (job_type, queue, status), ids in jobs.items()
                if job_type in types and queue in queues and status in statuses
                for job_id in ids
            ]
        )

    every_type, every_queue, every_status = {"sleep", "report"}, {"default", "mail"}, set(Status)
    assert await _ids(api, "limit=500") == expected(every_type, every_queue, every_status)
    for status in Status:
        got = await _ids(api, f"status={status.value}")
        assert got == expected(every_type, every_queue, {status}), status
    listed = await _ids(api, "status=failed,pending,dead_letter")
    assert listed == expected(
        every_type, every_queue, {Status.FAILED, Status.PENDING, Status.DEAD_LETTER}
    )
    assert await _ids(api, "type=report") == expected({"report"}, every_queue, every_status)
    assert await _ids(api, "queue=mail") == expected(every_type, {"mail"}, every_status)
    assert await _ids(api, "type=report&queue=mail") == expected({"report"}, {"mail"}, every_status)
    combined = await _ids(api, "status=processing,cancelled&type=sleep&queue=default")
    assert combined == expected({"sleep"}, {"default"}, {Status.PROCESSING, Status.CANCELLED})
    assert len(combined) == 4
    assert await _ids(api, "type=nothing") == []
    assert await _ids(api, "queue=empty") == []


async def test_limit_defaults_to_50_and_takes_1_to_500(api: httpx.AsyncClient, engine: AsyncEngine):
    ids = _newest_first(await _many(engine, MAX_LIMIT + 1))
    assert await _ids(api, "") == ids[:DEFAULT_LIMIT]
    assert await _ids(api, "limit=1") == ids[:1]
    full = await api.get(f"/jobs?limit={MAX_LIMIT}")
    assert [job["id"] for job in full.json()["jobs"]] == ids[:MAX_LIMIT]
    assert full.json()["next_cursor"] is not None
    rest = await api.get(f"/jobs?limit={MAX_LIMIT}&cursor={full.json()['next_cursor']}")
    assert [job["id"] for job in rest.json()["jobs"]] == ids[MAX_LIMIT:]
    assert rest.json()["next_cursor"] is None


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("limit=0", "'limit'"),
        ("limit=501", "'limit'"),
        ("limit=-1", "'limit'"),
        ("limit=1.0", "'limit'"),
        ("limit=", "'limit'"),
        ("limit=ten", "'limit'"),
        ("limit=%EF%BC%95", "'limit'"),  # a full-width digit
        ("status=done", "'done'"),
        ("status=pending,", "''"),
        ("status=Pending", "'Pending'"),
        ("status=", "''"),
        ("queue=Mail", "'queue'"),
        ("queue=", "'queue'"),
        ("type=", "'type'"),
        ("type=a%00b", "'type'"),
        ("cursor=abc", "'cursor'"),
        ("cursor=" + "A" * 21 + "B", "'cursor'"),  # 22 characters, but not 16 bytes exactly
        ("cursor=" + "A" * 22 + "==", "'cursor'"),
        ("sort=id", "'sort'"),
        ("status=pending&status=failed", "'status'"),
        ("limit=5&limit=5", "'limit'"),
    ],
)
async def test_bad_query_parameters_are_a_400_naming_them(
    api: httpx.AsyncClient, query: str, named: str
):
    r = await api.get(f"/jobs?{query}")
    assert r.status_code == 400, r.text
    assert named in r.json()["error"]


async def test_a_cursor_the_api_gave_pages_on_and_any_job_id_makes_a_cursor(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    ids = _newest_first(await _many(engine, 5))
    first = (await api.get("/jobs?limit=2")).json()
    assert [job["id"] for job in first["jobs"]] == ids[:2]
    second = await api.get(f"/jobs?limit=2&cursor={first['next_cursor']}")
    assert [job["id"] for job in second.json()["jobs"]] == ids[2:4]
    # The cursor is the last id seen: paging from an id lists what is older.
    by_id = await _ids(api, f"cursor={encode_cursor(UUID(ids[1]))}")
    assert by_id == ids[2:]


async def _page_through(api: httpx.AsyncClient, query: str) -> list[str]:
    seen: list[str] = []
    cursor = None
    while True:
        page = await api.get(f"/jobs?{query}" + (f"&cursor={cursor}" if cursor else ""))
        assert page.status_code == 200, page.text
        seen += [job["id"] for job in page.json()["jobs"]]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return seen
        await asyncio.sleep(0)  # let the inserter in between pages


@pytest.mark.parametrize(
    "query",
    ["limit=7", "limit=7&status=pending,completed", "limit=7&type=sleep", "limit=7&queue=mail"],
)
async def test_paging_while_jobs_are_inserted_sees_every_earlier_job_once_and_none_twice(
    api: httpx.AsyncClient, engine: AsyncEngine, query: str
):
    ids = await _many(engine, 150, queue="mail")
    await _set_status(engine, ids[::3], Status.COMPLETED)
    existing = {str(job_id) for job_id in ids}  # each pending or completed, in queue mail
    stop = asyncio.Event()
    inserted = 0

    async def insert() -> None:
        nonlocal inserted
        while not stop.is_set():
            await _many(engine, 3, queue="mail")
            inserted += 3
            await asyncio.sleep(0)

    inserter = asyncio.create_task(insert())
    try:
        seen = await _page_through(api, query)
    finally:
        stop.set()
        await inserter
    assert inserted > 0
    assert len(seen) == len(set(seen))
    assert existing <= set(seen)
    assert await job_count(engine) == len(ids) + inserted
