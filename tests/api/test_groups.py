"""Submit groups (docs/api.md#submit-groups): concurrent `POST /jobs` without a key share one
statement, and every request still gets exactly its own job, once, whatever happens to the
statement."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import store
from jobcore.ids import new_id
from jobqueue_api import calls
from jobqueue_api.database import open_engine
from jobqueue_api.groups import SubmitGroups
from jobqueue_api.notify import Notifier
from tests.api.conftest import job_count

CLIENTS = 60


async def _submit_all(api: httpx.AsyncClient, n: int = CLIENTS) -> list[httpx.Response]:
    return list(
        await asyncio.gather(
            *(api.post("/jobs", json={"type": "sleep", "payload": {"n": i}}) for i in range(n))
        )
    )


async def _created_at(engine: AsyncEngine) -> dict[str, Any]:
    async with engine.connect() as conn:
        rows = await conn.execute(sa.text("SELECT id::text, created_at FROM jobs"))
        return dict(rows.all())


async def test_concurrent_submits_share_statements_and_each_gets_its_own_job(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    answers = await _submit_all(api)
    assert [r.status_code for r in answers] == [201] * CLIENTS
    assert [r.json()["payload"] for r in answers] == [{"n": i} for i in range(CLIENTS)]
    stored = await _created_at(engine)
    assert sorted(stored) == sorted(r.json()["id"] for r in answers)
    for r in answers:
        assert (await api.get(f"/jobs/{r.json()['id']}")).json() == r.json()
    # One statement, one transaction, one now(): fewer creation times than jobs means
    # requests shared statements.
    assert len(set(stored.values())) < CLIENTS


@pytest.fixture
def groups_seen(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every group statement run."""
    sizes: list[int] = []
    real = calls.submit_group

    async def counted(conn: Any, new_jobs: Any, *, notify: bool = False) -> Any:
        sizes.append(len(new_jobs))
        return await real(conn, new_jobs, notify=notify)

    monkeypatch.setattr(calls, "submit_group", counted)
    return sizes


async def test_a_group_written_before_its_connection_died_answers_each_job_once(
    api: httpx.AsyncClient, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
):
    real = calls.submit_group
    lost: list[int] = []

    async def answer_lost(conn: Any, new_jobs: Any, *, notify: bool = False) -> Any:
        await real(conn, new_jobs, notify=notify)  # written and committed
        lost.append(len(new_jobs))
        conn.terminate()
        raise asyncpg.ConnectionDoesNotExistError("connection was closed")

    monkeypatch.setattr(calls, "submit_group", answer_lost)
    answers = await _submit_all(api)
    assert lost and max(lost) > 1
    assert [r.status_code for r in answers] == [201] * CLIENTS
    assert len({r.json()["id"] for r in answers}) == CLIENTS
    assert await job_count(engine) == CLIENTS


async def test_a_group_the_database_refused_is_submitted_one_request_at_a_time(
    api: httpx.AsyncClient, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
):
    refused: list[int] = []

    async def refuse(conn: Any, new_jobs: Any, *, notify: bool = False) -> Any:
        refused.append(len(new_jobs))
        raise asyncpg.CheckViolationError("refused")

    monkeypatch.setattr(calls, "submit_group", refuse)
    answers = await _submit_all(api)
    assert refused and max(refused) > 1
    assert [r.status_code for r in answers] == [201] * CLIENTS
    assert await job_count(engine) == CLIENTS


async def test_submits_with_keys_go_alone_and_replay_while_others_group(
    api: httpx.AsyncClient, engine: AsyncEngine, groups_seen: list[int]
):
    keyed = [
        api.post("/jobs", json={"type": "sleep"}, headers={"Idempotency-Key": "same"})
        for _ in range(10)
    ]
    answers = await asyncio.gather(
        *keyed, *(api.post("/jobs", json={"type": "sleep"}) for _ in range(30))
    )
    statuses = [r.status_code for r in answers[:10]]
    assert sorted(statuses) == [200] * 9 + [201]
    assert len({r.json()["id"] for r in answers[:10]}) == 1
    assert [r.status_code for r in answers[10:]] == [201] * 30
    assert sum(groups_seen) <= 30  # no keyed submit ever went into a group
    assert await job_count(engine) == 31


@pytest.fixture
async def groups(database_url: str):
    engine = open_engine(database_url)
    notifier = Notifier(engine)
    try:
        yield SubmitGroups(engine, notifier)
    finally:
        await notifier.close()
        await engine.dispose()


def _new() -> store.NewJob:
    return store.NewJob(new_id(), "sleep", {}, 3)


async def test_a_submit_whose_deadline_passed_before_its_group_left_is_not_written(
    groups: SubmitGroups, engine: AsyncEngine
):
    loop = asyncio.get_running_loop()
    late, on_time = _new(), _new()
    results = await asyncio.gather(
        groups.submit(late, loop.time() - 0.001),
        groups.submit(on_time, loop.time() + 5),
        return_exceptions=True,
    )
    assert isinstance(results[0], TimeoutError)
    job, created = results[1]
    assert created and job.id == on_time.id
    assert await job_count(engine) == 1


async def test_a_cancelled_submit_is_not_written_and_its_group_goes_on(
    groups: SubmitGroups, engine: AsyncEngine
):
    deadline = asyncio.get_running_loop().time() + 5
    news = [_new() for _ in range(5)]
    tasks = [asyncio.create_task(groups.submit(new, deadline)) for new in news]
    await asyncio.sleep(0)  # every submit has joined the waiting group
    tasks[2].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[2], asyncio.CancelledError)
    written = {job.id for job, created in (d for i, d in enumerate(done) if i != 2)}
    assert written == {new.id for i, new in enumerate(news) if i != 2}
    assert await job_count(engine) == 4
