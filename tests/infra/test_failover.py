"""A PostgreSQL failover under the real services: a primary with a synchronous standby, both
named in a multi-host `DATABASE_URL`; the primary dies, the standby is promoted, and the
API and the worker find it without a restart, losing no acknowledged job. A connection that
reaches a standby is refused its writes, dropped, and answered 503."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import sqlalchemy as sa
import sqlalchemy.exc as sa_exc

from jobcore.db import check_writable, connect_args, make_engine
from jobcore.errors import ReadOnlyServer
from jobqueue_api.database import is_unavailable, on_driver, open_engine
from tests.e2e.test_api_process import Api
from tests.infra.replication import Pair, promote
from tests.procs import Service, wait_for
from tests.worker.support import Worker, read_log, start_worker

pytestmark = pytest.mark.e2e

# The contract: submits and jobs work again within this many seconds of the promotion.
RECOVERY = 30.0
STARTUP = 60.0


def _submit(api: Api, seconds: float = 0) -> Any:
    try:
        return api.post("/jobs", json={"type": "test.record", "payload": {"seconds": seconds}})
    except Exception as exc:  # a transport error is as much a failure as a 500
        raise AssertionError(f"POST /jobs did not answer: {exc!r}") from exc


def _submitted(api: Api, count: int, seconds: float = 0) -> list[str]:
    ids = []
    for _ in range(count):
        created = _submit(api, seconds)
        assert created.status_code == 201, created.text
        ids.append(created.json()["id"])
    return ids


def _statuses(api: Api, ids: list[str]) -> dict[str, str]:
    return {job_id: api.get(f"/jobs/{job_id}/status").json()["status"] for job_id in ids}


def _alive(service: Service) -> bool:
    return service.proc.poll() is None


def test_the_services_find_the_promoted_standby_and_lose_no_acknowledged_job(
    pair: Pair, tmp_path: Path
) -> None:
    url = pair.url()
    api = Api(url, JOB_TYPES="test.record")
    worker: Worker | None = None
    try:
        worker = start_worker(url, tmp_path, WORKERS="4")
        api.wait_ready()
        wait_for(lambda: worker.status_of("/readyz") == 200, STARTUP, "the worker ready")
        api_pid, worker_pid, children = api.service.proc.pid, worker.proc.pid, worker.child_pids()

        before = _submitted(api, 4)
        wait_for(lambda: set(_statuses(api, before).values()) == {"completed"}, 30, "jobs before")
        # Acknowledged just before the primary dies: some still pending, some running.
        during = _submitted(api, 3, seconds=1) + _submitted(api, 5)
        listens = len(worker.messages("listening for wake-ups"))

        pair.primary.stop("immediate")
        # No writable server (the standby is not promoted yet): unready, submits refused.
        wait_for(lambda: api.status_of("/readyz") == 503, 15, "the API's /readyz 503")
        wait_for(lambda: worker.status_of("/readyz") == 503, 15, "the worker's /readyz 503")
        refused = _submit(api)
        assert refused.status_code == 503, refused.text

        promote(pair.standby)
        promoted = time.monotonic()
        first: list[str] = []

        def accepted() -> bool:
            answer = _submit(api)
            assert answer.status_code in (201, 503), answer.text  # never a 500
            if answer.status_code == 201:
                first.append(answer.json()["id"])
            return bool(first)

        wait_for(accepted, RECOVERY, "a submit to succeed", interval=0.2)
        after = first + _submitted(api, 4)
        every = before + during + after
        wait_for(
            lambda: set(_statuses(api, every).values()) == {"completed"},
            RECOVERY - (time.monotonic() - promoted),
            "every acknowledged job completed within 30 s of the promotion",
        )
        assert api.status_of("/readyz") == 200
        wait_for(lambda: worker.status_of("/readyz") == 200, 10, "the worker ready again")
        # The worker's wake-ups are heard from the new primary.
        wait_for(
            lambda: len(worker.messages("listening for wake-ups")) > listens,
            10,
            "the worker listening again",
        )
        ran = {job_id for event, job_id, _attempt, _pid in read_log(worker.exec_log)}
        assert set(every) <= ran

        # Found without a restart: the same processes throughout.
        assert _alive(api.service) and api.service.proc.pid == api_pid, api.service.output()
        assert _alive(worker) and worker.proc.pid == worker_pid, worker.output()
        assert worker.child_pids() == children
        assert not worker.messages("worker process died, restarting")
        errors = [line for line in api.service.logs() if line.get("level") == "error"]
        assert not errors
    finally:
        for service in (api.service, worker):
            if service is not None and _alive(service):
                service.kill()


async def _backend(engine: Any) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(sa.text("SELECT pg_backend_pid()")))


async def test_a_connection_that_reaches_a_standby_is_dropped_and_its_write_is_unavailable(
    pair: Pair,
) -> None:
    # The standby first and no target_session_attrs: connections land on the standby.
    primary, standby = pair.primary.port, pair.standby.port
    anywhere = f"postgresql://postgres@127.0.0.1:{standby},127.0.0.1:{primary}/jobqueue"
    engine = make_engine(anywhere, isolation_level="AUTOCOMMIT")
    api_engine = open_engine(anywhere)
    try:
        async with engine.connect() as conn:
            assert await conn.scalar(sa.text("SELECT inet_server_port()")) == standby
            refused_on = await conn.scalar(sa.text("SELECT pg_backend_pid()"))
            with pytest.raises(sa_exc.DBAPIError) as refused:
                await conn.execute(sa.text("NOTIFY jobqueue_wakeup"))
            assert refused.value.connection_invalidated
            assert is_unavailable(refused.value)
        assert await _backend(engine) != refused_on  # dropped, never handed out again

        async with engine.connect() as conn:
            unready_on = await conn.scalar(sa.text("SELECT pg_backend_pid()"))
            with pytest.raises(ReadOnlyServer):
                await check_writable(conn)
        assert await _backend(engine) != unready_on

        # The API's hot path, on the driver's connection: retried once on a fresh
        # connection (which lands on the standby again), then refused, neither kept.
        tried_on: list[int] = []

        async def write(conn: asyncpg.Connection, again: bool) -> None:
            tried_on.append(await conn.fetchval("SELECT pg_backend_pid()"))
            await conn.execute("NOTIFY jobqueue_wakeup")

        with pytest.raises(asyncpg.ReadOnlySQLTransactionError) as hot:
            await on_driver(api_engine, write, retry=True)
        assert is_unavailable(hot.value)
        assert len(set(tried_on)) == 2
        assert await _backend(api_engine) not in tried_on

        # Asking for read-write skips the standby, listed first or not.
        writable = anywhere + "?target_session_attrs=read-write"
        conn = await asyncpg.connect(**connect_args(writable))
        try:
            assert await conn.fetchval("SELECT inet_server_port()") == primary
        finally:
            await conn.close()
    finally:
        await engine.dispose()
        await api_engine.dispose()


def test_the_services_on_a_standby_are_unready_and_the_api_answers_submits_503(
    pair: Pair, tmp_path: Path
) -> None:
    on_standby = f"postgresql://postgres@127.0.0.1:{pair.standby.port}/jobqueue"
    api = Api(on_standby, JOB_TYPES="test.record")
    worker = start_worker(on_standby, tmp_path)
    try:
        wait_for(lambda: api.status_of("/readyz") is not None, STARTUP, "the API serving")
        ready = api.get("/readyz")
        assert ready.status_code == 503 and ready.json() == {"error": "database read-only"}
        for _ in range(3):  # each on a fresh connection: the last one was dropped
            refused = _submit(api)
            assert refused.status_code == 503, refused.text
        assert api.status_of("/readyz") == 503
        assert _alive(api.service)
        assert not [line for line in api.service.logs() if line.get("level") == "error"]

        def worker_unready() -> bool:
            assert _alive(worker), worker.output()
            answer = worker.get("/readyz") if worker.status_of("/readyz") else None
            return answer is not None and answer.json()["status"] == "database read-only"

        wait_for(worker_unready, STARTUP, "the worker's /readyz: database read-only")
        assert worker.get("/readyz").status_code == 503
    finally:
        for service in (api.service, worker):
            if _alive(service):
                service.kill()
