"""Submit groups (docs/api.md#submit-groups): concurrent `POST /jobs` without a key share one
statement, and every request still gets exactly its own job, once, whatever happens to the
statement."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore.ids import new_id
from jobcore.rows import Job, NewJob
from jobcore.states import Status
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
        rows = await conn.execute(sa.text("SELECT id::text, created_at FROM jobqueue.jobs"))
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
        assert (await api.get(f"/jobs/{r.json()['id']}")).json() == {**r.json(), "errors": []}
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


def _new() -> NewJob:
    return NewJob(new_id(), "sleep", {}, 3)


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


def _job(new: NewJob) -> Job:
    now = datetime.now(UTC)
    return Job(
        new.id,
        new.type,
        new.payload,
        Status.PENDING,
        0,
        new.max_attempts,
        now,
        None,
        0,
        None,
        new.idempotency_key,
        now,
        now,
        new.queue,
        new.priority,
        new.timeout,
        new.concurrency_key,
        None,
        None,
        None,
    )


class _Held:
    """The database, held: every statement waits for `release`, then answers at once (in
    the same turn of the loop for all of them) with the jobs it would have written."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def on_driver(self, engine: Any, call: Any, *, retry: bool) -> Any:
        await self.release.wait()
        return await call(None, False)

    async def submit_group(self, conn: Any, new_jobs: Any, *, notify: bool = False) -> Any:
        return [_job(new) for new in new_jobs]

    async def submit(self, conn: Any, new: Any, *, notify: bool = False, again: bool = False):
        return _job(new), True


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> _Held:
    from jobqueue_api import groups as module

    held = _Held()
    monkeypatch.setattr(module, "on_driver", held.on_driver)
    monkeypatch.setattr(calls, "submit_group", held.submit_group)
    monkeypatch.setattr(calls, "submit", held.submit)
    return held


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_submit_arriving_as_every_flight_ends_starts_one_of_its_own(
    groups: SubmitGroups, held: _Held
):
    deadline = asyncio.get_running_loop().time() + 5
    first = asyncio.create_task(groups.submit(_new(), deadline))
    await _turns(2)  # the first flight holds the first submit
    second = asyncio.create_task(groups.submit(_new(), deadline))
    await _turns(2)  # the second flight holds the second

    async def just_as_they_end() -> tuple[Job, bool]:
        await held.release.wait()  # woken in the turn both flights end in, after them
        return await groups.submit(_new(), deadline)

    late = asyncio.create_task(just_as_they_end())
    await _turns(1)
    held.release.set()
    assert (await first)[1] and (await second)[1]
    _, created = await asyncio.wait_for(late, 2)
    assert created


async def test_a_member_close_to_its_deadline_does_not_cut_its_group_short(
    groups: SubmitGroups, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
):
    real = calls.submit_group

    async def slow(conn: Any, new_jobs: Any, *, notify: bool = False) -> Any:
        await asyncio.sleep(0.3)
        return await real(conn, new_jobs, notify=notify)

    monkeypatch.setattr(calls, "submit_group", slow)
    loop = asyncio.get_running_loop()
    news = [_new() for _ in range(10)]
    deadlines = [loop.time() + 0.1] + [loop.time() + 5] * 9
    submits = (groups.submit(n, d) for n, d in zip(news, deadlines, strict=True))
    done = await asyncio.gather(*submits)
    assert [created for _, created in done] == [True] * 10
    assert await job_count(engine) == 10
