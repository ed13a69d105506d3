"""GET /jobs/{id}?wait=: answered as soon as the job finishes or when the wait ends, without
holding a database connection while waiting, and without missing a finish when the
listening connection breaks."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import control
from jobcore.db import session_name
from jobcore.states import Status
from jobqueue_api import waiters as waiters_module
from jobqueue_api.app import close, shut_down
from jobqueue_api.state import state_of
from jobqueue_api.waiters import Waiters
from tests.api.conftest import MakeApi, app_of
from tests.api.jobstates import end, in_status, submit, take
from tests.faultproxy import FaultProxy


def _waiters(api: httpx.AsyncClient) -> Waiters:
    waiters: Waiters = state_of(app_of(api)).waiters
    return waiters


async def _until(predicate: Callable[[], Any], what: str, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def _awaited(engine: AsyncEngine, job_id: uuid.UUID) -> bool:
    async with engine.connect() as conn:
        query = sa.text("SELECT awaited FROM jobqueue.jobs WHERE id = :id")
        return bool(await conn.scalar(query, {"id": job_id}))


async def _waiting(api: httpx.AsyncClient, engine: AsyncEngine, job_id: uuid.UUID, n: int = 1):
    """Until `n` requests wait for the job, and the job is marked as awaited."""
    await _until(lambda: _waiters(api).count >= n, f"{n} waiter(s)")
    deadline = time.monotonic() + 10
    while not await _awaited(engine, job_id):
        assert time.monotonic() < deadline, "the job was never marked as awaited"
        await asyncio.sleep(0.005)


async def test_a_finished_job_is_answered_at_once(api: httpx.AsyncClient, engine: AsyncEngine):
    for status in (Status.COMPLETED, Status.FAILED, Status.DEAD_LETTER, Status.CANCELLED):
        job = await in_status(engine, status)
        started = time.monotonic()
        r = await api.get(f"/jobs/{job.id}?wait=30s")
        assert time.monotonic() - started < 1
        assert (r.status_code, r.json()["status"]) == (200, status.value)


async def test_a_waiter_is_answered_when_its_job_completes_with_the_result(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    job = await submit(engine)
    lease = await take(engine, job.id)
    waiting = asyncio.create_task(api.get(f"/jobs/{job.id}?wait=30"))
    await _waiting(api, engine, job.id)
    # Waiting holds no connection of the pool: it is only a future in a dict.
    assert state_of(app_of(api)).engine.pool.checkedout() == 0
    await end(engine, lease, Status.COMPLETED, result={"rows": 3})
    finished = time.monotonic()
    r = await waiting
    assert time.monotonic() - finished < 1
    assert r.status_code == 200
    assert (r.json()["status"], r.json()["result"]) == ("completed", {"rows": 3})
    assert r.json()["finished_at"] is not None
    assert _waiters(api).count == 0


@pytest.mark.parametrize("status", [Status.FAILED, Status.DEAD_LETTER])
async def test_a_waiter_is_answered_when_its_attempt_ends_failed_or_dead_lettered(
    api: httpx.AsyncClient, engine: AsyncEngine, status: Status
):
    job = await submit(engine)
    lease = await take(engine, job.id)
    waiting = asyncio.create_task(api.get(f"/jobs/{job.id}?wait=30s"))
    await _waiting(api, engine, job.id)
    await end(engine, lease, status)
    r = await asyncio.wait_for(waiting, 5)
    assert r.json()["status"] == status.value


async def test_a_waiter_is_answered_when_its_pending_job_is_cancelled(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    job = await submit(engine)
    waiting = asyncio.create_task(api.get(f"/jobs/{job.id}?wait=1m"))
    await _waiting(api, engine, job.id)
    assert (await api.post(f"/jobs/{job.id}/cancel")).status_code == 200
    r = await asyncio.wait_for(waiting, 5)
    assert r.json()["status"] == "cancelled"


async def test_many_waiters_of_one_job_are_all_answered_by_its_finish(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    job = await submit(engine)
    lease = await take(engine, job.id)
    waiting = [asyncio.create_task(api.get(f"/jobs/{job.id}?wait=30s")) for _ in range(50)]
    await _waiting(api, engine, job.id, 50)
    await end(engine, lease, Status.COMPLETED)
    answers = await asyncio.wait_for(asyncio.gather(*waiting), 10)
    assert {(r.status_code, r.json()["status"]) for r in answers} == {(200, "completed")}


async def test_when_the_wait_ends_first_the_job_is_answered_as_it_is(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    job = await submit(engine)
    started = time.monotonic()
    r = await api.get(f"/jobs/{job.id}?wait=500ms")
    waited = time.monotonic() - started
    assert 0.5 <= waited < 2
    assert (r.status_code, r.json()["status"]) == (200, "pending")
    assert _waiters(api).count == 0


async def test_waiting_for_an_unknown_or_malformed_id_is_404_at_once(api: httpx.AsyncClient):
    for job_id in (str(uuid.uuid4()), "not-a-uuid"):
        started = time.monotonic()
        r = await api.get(f"/jobs/{job_id}?wait=30s")
        assert time.monotonic() - started < 1
        assert r.status_code == 404 and "not found" in r.json()["error"]


@pytest.mark.parametrize(
    "wait", ["0", "0s", "61", "1m0.001s", "2m", "-1", "1e1", "soon", "", "5 s", "%EF%BC%95"]
)
async def test_a_wait_that_is_not_a_duration_above_0_and_at_most_60s_is_a_400(
    api: httpx.AsyncClient, engine: AsyncEngine, wait: str
):
    job = await submit(engine)
    r = await api.get(f"/jobs/{job.id}?wait={wait}")
    assert r.status_code == 400, wait
    assert "'wait'" in r.json()["error"]
    assert not await _awaited(engine, job.id)


async def test_waits_take_seconds_or_go_durations_up_to_60s(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    job = await in_status(engine, Status.COMPLETED)
    for wait in ("60", "60s", "1m", "0.1", "250ms", "59.5s", "1m0s", "0.5m"):
        assert (await api.get(f"/jobs/{job.id}?wait={wait}")).status_code == 200, wait
    for query in ("wait=1s&wait=2s", "timeout=1s"):
        r = await api.get(f"/jobs/{job.id}?{query}")
        assert r.status_code == 400 and "query parameter" in r.json()["error"]


async def test_a_finish_while_the_listener_is_down_is_not_missed_and_others_keep_waiting(
    api: httpx.AsyncClient, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
):
    waiters = _waiters(api)
    reconnect = asyncio.Event()
    connects = 0
    connect = Waiters._connect

    async def gated_connect(self: Waiters) -> None:
        nonlocal connects
        connects += 1
        if connects > 1:
            await reconnect.wait()
        await connect(self)

    monkeypatch.setattr(Waiters, "_connect", gated_connect)
    finishing, staying = await submit(engine), await submit(engine)
    lease = await take(engine, finishing.id)
    first = asyncio.create_task(api.get(f"/jobs/{finishing.id}?wait=30s"))
    second = asyncio.create_task(api.get(f"/jobs/{staying.id}?wait=30s"))
    await _waiting(api, engine, finishing.id, 2)
    await _waiting(api, engine, staying.id, 2)

    async with engine.begin() as conn:
        killed = await conn.scalar(
            sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                f"WHERE application_name = '{session_name('jobqueue-api-listen')}'"
                " AND datname = current_database()"
            )
        )
    assert killed == 1
    await _until(lambda: not waiters.listening and connects == 2, "the listener to notice")
    # Nobody listens: this finish's notification is lost.
    await end(engine, lease, Status.COMPLETED)
    await asyncio.sleep(0.2)
    assert not first.done()
    reconnect.set()
    r = await asyncio.wait_for(first, 5)
    assert r.json()["status"] == "completed"
    # The other job has not finished: its waiter waits on, and hears its finish later.
    await asyncio.sleep(0.2)
    assert not second.done() and waiters.count == 1
    await end(engine, await take(engine, staying.id), Status.FAILED)
    r = await asyncio.wait_for(second, 5)
    assert r.json()["status"] == "failed"


async def test_when_no_listener_can_be_established_a_wait_is_a_503(
    api: httpx.AsyncClient, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
):
    async def unreachable(self: Waiters) -> None:
        raise OSError("connection refused")

    monkeypatch.setattr(Waiters, "_connect", unreachable)
    monkeypatch.setattr(waiters_module, "REQUEST_DEADLINE", 0.3)
    job = await submit(engine)
    r = await api.get(f"/jobs/{job.id}?wait=30s")
    assert r.status_code == 503 and r.json() == {"error": "database unavailable"}
    # A wait shorter than that is answered with the job as it is when it ends.
    short = await api.get(f"/jobs/{job.id}?wait=100ms")
    assert (short.status_code, short.json()["status"]) == (200, "pending")


async def test_on_shutdown_waiters_are_answered_at_once_and_new_waits_do_not_wait(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    job = await submit(engine)
    waiting = asyncio.create_task(api.get(f"/jobs/{job.id}?wait=1m"))
    await _waiting(api, engine, job.id)
    shut_down(app_of(api))
    r = await asyncio.wait_for(waiting, 2)
    assert (r.status_code, r.json()["status"]) == (200, "pending")
    started = time.monotonic()
    again = await api.get(f"/jobs/{job.id}?wait=1m")
    assert time.monotonic() - started < 1
    assert again.json()["status"] == "pending"


async def test_a_job_finished_then_retried_before_the_read_is_waited_for_again(
    api: httpx.AsyncClient, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
):
    job = await submit(engine)
    lease = await take(engine, job.id)
    read = waiters_module._read
    retried = asyncio.Event()

    async def read_after_a_retry(engine_: AsyncEngine, job_id: uuid.UUID) -> Any:
        if not retried.is_set():
            # An operator retries the job between its finish and this waiter's read.
            async with engine.begin() as conn:
                assert await control.manual_retry(conn, job_id) is not None
            retried.set()
        return await read(engine_, job_id)

    monkeypatch.setattr(waiters_module, "_read", read_after_a_retry)
    waiting = asyncio.create_task(api.get(f"/jobs/{job.id}?wait=30s"))
    await _waiting(api, engine, job.id)
    await end(engine, lease, Status.FAILED)
    await asyncio.wait_for(retried.wait(), 5)
    # Pending again: the waiter marked it again and waits for its next finish.
    await _waiting(api, engine, job.id)
    assert not waiting.done()
    await end(engine, await take(engine, job.id), Status.COMPLETED)
    r = await asyncio.wait_for(waiting, 5)
    assert r.json()["status"] == "completed"


async def test_waiting_requires_the_token_when_api_tokens_is_set(
    make_api: MakeApi, engine: AsyncEngine
):
    api = await make_api(API_TOKENS="s3cret")
    job = await in_status(engine, Status.COMPLETED)
    assert (await api.get(f"/jobs/{job.id}?wait=1s")).status_code == 401
    ok = await api.get(f"/jobs/{job.id}?wait=1s", headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200


async def test_waiters_listen_through_database_listen_url_when_it_is_set(
    make_api: MakeApi, engine: AsyncEngine, database_url: str
):
    # The same database through a proxy: only the listening connection comes through it.
    with FaultProxy.to_database(database_url) as proxy:
        api = await make_api(DATABASE_LISTEN_URL=proxy.database_url(database_url))
        job = await submit(engine)
        lease = await take(engine, job.id)
        waiting = asyncio.create_task(api.get(f"/jobs/{job.id}?wait=30s"))
        await _waiting(api, engine, job.id)
        await _until(lambda: proxy.open_connections == 1, "the listener through the proxy")
        await end(engine, lease, Status.COMPLETED)
        finished = time.monotonic()
        r = await waiting
        assert time.monotonic() - finished < 1
        assert (r.status_code, r.json()["status"]) == (200, "completed")
        assert proxy.open_connections == 1
        await close(app_of(api))


async def test_a_listener_that_hears_its_notification_check_is_shown_ok_in_readyz(
    make_api: MakeApi,
):
    api = await make_api()
    _waiters(api).start()
    # Before a check has finished, /readyz says so; it answers 200 all along.
    first = await api.get("/readyz")
    assert first.status_code == 200 and first.json()["notifications"] in {"unchecked", "ok"}
    await _until(lambda: _waiters(api).notifications.state == "ok", "a check heard")
    assert (await api.get("/readyz")).json() == {"status": "ready", "notifications": "ok"}
    await close(app_of(api))


async def test_while_notifications_go_unheard_a_wait_reads_its_job_until_it_finished(
    make_api: MakeApi, engine: AsyncEngine, empty_database_url: str, caplog
):
    # Listening on another database: the connection answers, but never hears the jobs'
    # database (as behind a pooler in transaction mode).
    api = await make_api(DATABASE_LISTEN_URL=empty_database_url)
    unheard = waiters_module.metrics.NOTIFICATIONS_UNHEARD._value.get()
    job = await submit(engine)
    lease = await take(engine, job.id)
    waiting = asyncio.create_task(api.get(f"/jobs/{job.id}?wait=60s"))
    await _waiting(api, engine, job.id)
    await _until(lambda: _waiters(api).notifications.state == "unheard", "the verdict", 15)
    body = (await api.get("/readyz")).json()
    assert body == {"status": "ready", "notifications": "unheard"}
    assert waiters_module.metrics.NOTIFICATIONS_UNHEARD._value.get() > unheard
    assert "notifications unheard" in caplog.messages
    await end(engine, lease, Status.COMPLETED)
    finished = time.monotonic()
    r = await waiting
    assert time.monotonic() - finished < waiters_module.WAIT_POLL_INTERVAL + 1
    assert (r.status_code, r.json()["status"]) == (200, "completed")
    await close(app_of(api))
