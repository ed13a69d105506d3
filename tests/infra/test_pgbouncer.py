"""The real API and worker with their `DATABASE_URL` through a real PgBouncer 1.24.1, in
session and in transaction mode: submits, claims, retries, cancels, waits, per-type limits
and periodic jobs work; in transaction mode no session setting of theirs reaches another
client of the pooler; a `LISTEN` through a transaction-mode pooler is reported unheard
while the jobs still complete."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url

from jobcore.db import connect_args
from tests.e2e.periodic_schedules import NAME as PERIODIC_NAME
from tests.e2e.test_api_process import Api
from tests.infra.pgbouncer import CURRENT, PgBouncer
from tests.procs import Service, wait_for
from tests.worker.support import Worker, read_log, start_worker

pytestmark = pytest.mark.e2e

STARTUP = 60.0
HANDLERS = "tests.worker.handlers,tests.e2e.periodic_schedules"
TYPES = "test.record,test.flag,test.span,test.block"
# Every setting the services set for their own statements: another client must see none.
SETTINGS = (
    "synchronous_commit",
    "statement_timeout",
    "lock_timeout",
    "enable_sort",
    "enable_seqscan",
    "jit",
    "jit_above_cost",
    "plan_cache_mode",
    "client_connection_check_interval",
    "idle_in_transaction_session_timeout",
)
# Session mode binds a server connection to each client connection for its lifetime: the
# pool must hold every connection of the services (API 10, worker process 8, supervisor 1)
# and the test's own. Transaction mode shares 2 between all of them.
POOL_SIZE = {"session": 30, "transaction": 2}


def _bouncer(mode: str) -> PgBouncer:
    return PgBouncer(
        CURRENT,
        mode,
        default_pool_size=POOL_SIZE[mode],
        max_prepared_statements=100 if mode == "transaction" else None,
    )


@pytest.fixture(params=["session", "transaction"])
def bouncer(request: pytest.FixtureRequest) -> Iterator[PgBouncer]:
    with _bouncer(request.param) as bouncer:
        yield bouncer


@pytest.fixture
def transaction_bouncer() -> Iterator[PgBouncer]:
    with _bouncer("transaction") as bouncer:
        yield bouncer


class Stack:
    """The API and a worker service, started in that order; killed at the end if alive."""

    def __init__(self) -> None:
        self.services: list[Service] = []

    def worker(self, url: str, tmp_path: Path, **env: str) -> Worker:
        worker = start_worker(url, tmp_path, JOB_HANDLERS=HANDLERS, **env)
        self.services.append(worker)
        wait_for(lambda: _ready(worker), STARTUP, "the worker ready")
        return worker

    def api(self, url: str, **env: str) -> Api:
        api = Api(url, JOB_TYPES=TYPES, **env)
        self.services.append(api.service)
        api.wait_ready()
        return api

    def kill(self) -> None:
        for service in self.services:
            if service.proc.poll() is None:
                service.kill()


def _ready(worker: Worker) -> bool:
    assert worker.proc.poll() is None, worker.output()
    return worker.status_of("/readyz") == 200


def _database(url: str) -> str:
    name = make_url(url).database
    assert name
    return name


def _submit(api: Api, job: dict[str, Any]) -> str:
    created = api.post("/jobs", json=job)
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def _waited(api: Api, job_id: str, wait: float) -> Any:
    """`GET /jobs/{id}?wait=`: the job as it is when the answer comes."""
    answer = httpx.get(f"{api.base}/jobs/{job_id}", params={"wait": f"{wait}s"}, timeout=wait + 10)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _status(api: Api, job_id: str) -> str:
    return str(api.get(f"/jobs/{job_id}/status").json()["status"])


def _all(api: Api, ids: list[str], status: str, within: float, what: str) -> None:
    wait_for(lambda: all(_status(api, i) == status for i in ids), within, what, interval=0.1)


def _counter(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return sample.value
    raise AssertionError(f"{name} is not exported")


def _wait_notifications(service: Api | Worker, expected: str, within: float = 20) -> None:
    """Until `/readyz` (200) says `"notifications": expected`; else fail with its last body."""
    last: list[str] = []

    def says() -> bool:
        answer = service.get("/readyz")
        assert answer.status_code == 200, answer.text
        last[:] = [answer.text]
        return bool(answer.json().get("notifications") == expected)

    try:
        wait_for(says, within, f'/readyz saying "notifications": "{expected}"', interval=0.2)
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}; it says {last[0]}") from None


def _direct(url: str) -> psycopg.Connection:
    u = make_url(url)
    return psycopg.connect(host="127.0.0.1", port=u.port or 5432, dbname=u.database)


def _spans(exec_log: Path) -> list[tuple[float, float]]:
    spans = Path(str(exec_log) + ".spans")
    rows = [line.split() for line in spans.read_text().splitlines()] if spans.exists() else []
    return sorted((float(start), float(end)) for _id, _attempt, start, end in rows)


def test_the_core_works_through_pgbouncer(
    bouncer: PgBouncer, database_url: str, stack: Stack, tmp_path: Path
) -> None:
    pooled = bouncer.url(database_url)
    database = _database(database_url)
    # LISTEN straight to PostgreSQL, as a transaction-mode pooler requires.
    worker = stack.worker(
        pooled,
        tmp_path,
        DATABASE_LISTEN_URL=database_url,
        WORKERS="4",
        TYPE_CONCURRENCY="test.span:1",
        BACKOFF_BASE="0.1s",
        BACKOFF_MAX="0.1s",
    )
    api = stack.api(pooled, DATABASE_LISTEN_URL=database_url)

    # POST /jobs, and ?wait= answered at the job's end, well before its deadline.
    one = _submit(api, {"type": "test.record", "payload": {"seconds": 1}})
    asked = time.monotonic()
    waited = _waited(api, one, 30)
    took = time.monotonic() - asked
    assert waited["status"] == "completed", waited
    assert took < 10, f"?wait=30s answered after {took:.1f}s"

    # POST /jobs/batch: one statement, every job claimed and completed.
    batch = api.post("/jobs/batch", json={"jobs": [{"type": "test.record"} for _ in range(20)]})
    assert batch.status_code == 200, batch.text
    results = batch.json()["results"]
    assert [r["status"] for r in results] == ["created"] * 20
    batched = [r["id"] for r in results]
    _all(api, batched, "completed", 30, "the batch completed")

    # A retry after a failure: the first attempt fails while the flag file exists.
    flag = tmp_path / "flag"
    flag.touch()
    flaky = _submit(api, {"type": "test.flag", "payload": {"path": str(flag)}})
    wait_for(
        lambda: any(job == flaky for _e, job, _a, _p in read_log(worker.exec_log)),
        20,
        "the first attempt",
    )
    flag.unlink()
    _all(api, [flaky], "completed", 20, "the retried job completed")
    retried = api.get(f"/jobs/{flaky}").json()
    assert retried["attempts"] >= 2 and retried["errors"], retried

    # A cancel of a running job: 202, and the worker stops it within seconds.
    blocked = _submit(api, {"type": "test.block"})
    _all(api, [blocked], "processing", 20, "the blocking job running")
    cancel = api.post(f"/jobs/{blocked}/cancel")
    assert cancel.status_code == 202, cancel.text
    ended = _waited(api, blocked, 20)
    assert ended["status"] == "cancelled", ended

    # TYPE_CONCURRENCY=test.span:1: four slots free, yet one span at a time.
    spans = [_submit(api, {"type": "test.span", "payload": {"seconds": 0.3}}) for _ in range(4)]
    _all(api, spans, "completed", 30, "the limited jobs completed")
    ran = _spans(worker.exec_log)
    assert len(ran) == 4
    for (_start, end), (next_start, _end) in itertools.pairwise(ran):
        assert next_start >= end, f"test.span jobs overlapped: {ran}"

    # The periodic schedule (every 2 s) submitted and ran its jobs.
    with _direct(database_url) as conn:
        periodic = conn.execute(
            "SELECT count(*) FROM jobqueue.jobs WHERE idempotency_key LIKE %s"
            " AND status = 'completed'",
            (f"periodic:{PERIODIC_NAME}:%",),
        ).fetchone()
    assert periodic is not None and periodic[0] >= 1

    # It all went through PgBouncer: both services are its clients, and it carried their
    # transactions.
    names = {row["application_name"] for row in bouncer.show("CLIENTS")}
    assert any(n.startswith("jobqueue-api") for n in names), names
    assert any(n.startswith("jobqueue-worker") for n in names), names
    assert bouncer.stats(database)["total_xact_count"] > 100
    (pool,) = bouncer.pools(database)
    assert pool["pool_mode"] == bouncer.pool_mode

    errors = [line for line in api.service.logs() if line.get("level") == "error"]
    assert not errors, errors
    assert not worker.messages("worker process died, restarting")

    # With LISTEN direct, the notification checks are heard.
    _wait_notifications(api, "ok")
    _wait_notifications(worker, "ok")


_SHOW = "SELECT " + ", ".join(f"current_setting('{name}')" for name in SETTINGS)


def _settings(conn: psycopg.Connection) -> dict[str, str]:
    """Each of SETTINGS as `conn` sees it now."""
    row = conn.execute(_SHOW).fetchone()
    assert row is not None
    return dict(zip(SETTINGS, row, strict=True))


def _leaks(bouncer: PgBouncer, database: str, defaults: dict[str, str], rounds: int) -> list[Any]:
    """What differs from `defaults` on `rounds` × 2 transactions of other clients. Each round
    opens a transaction on each of two client connections at once, so it holds both server
    connections of the pool (its size is 2): every one of them is read, every round."""
    leaked = []
    observers = [
        bouncer.connect(database, application_name="settings-observer", autocommit=False)
        for _ in range(POOL_SIZE["transaction"])
    ]
    try:
        for _ in range(rounds):
            seen = [_settings(conn) for conn in observers]
            for conn in observers:
                conn.rollback()
            leaked += [
                {k: v for k, v in one.items() if v != defaults[k]}
                for one in seen
                if one != defaults
            ]
    finally:
        for conn in observers:
            conn.close()
    return leaked


def test_in_transaction_mode_no_setting_of_the_services_reaches_another_client(
    transaction_bouncer: PgBouncer, database_url: str, stack: Stack, tmp_path: Path
) -> None:
    bouncer = transaction_bouncer
    pooled = bouncer.url(database_url)
    database = _database(database_url)
    with _direct(database_url) as conn:
        conn.autocommit = True
        defaults = _settings(conn)
    # Neither a default nor set by anyone else: what the services set is different.
    assert defaults["synchronous_commit"] == "on" and defaults["enable_sort"] == "on"

    stack.worker(
        pooled, tmp_path, DATABASE_LISTEN_URL=database_url, WORKER_SYNCHRONOUS_COMMIT="off"
    )
    # Worker alone first: its sessions are opened, its claims and heartbeats run.
    wait_for(lambda: bouncer.stats(database).get("total_xact_count", 0) > 50, 30, "traffic")
    leaked = _leaks(bouncer, database, defaults, 25)
    assert not leaked, f"{len(leaked)} of 50 transactions saw the worker's settings: {leaked[:3]}"

    api = stack.api(pooled, DATABASE_LISTEN_URL=database_url)
    ids = [_submit(api, {"type": "test.record", "payload": {"seconds": 0.05}}) for _ in range(30)]
    # Sampled while the jobs run, and after.
    leaked = _leaks(bouncer, database, defaults, 25)
    _all(api, ids, "completed", 30, "the jobs completed")
    leaked += _leaks(bouncer, database, defaults, 25)
    assert not leaked, f"{len(leaked)} of 100 transactions saw the services' settings: {leaked[:3]}"
    # Both services were the pooler's clients, sharing its two server connections.
    names = {row["application_name"] for row in bouncer.show("CLIENTS")}
    assert any(n.startswith("jobqueue-api") for n in names), names
    assert any(n.startswith("jobqueue-worker") for n in names), names


def test_a_listen_through_a_transaction_pooler_is_reported_unheard_and_jobs_still_complete(
    transaction_bouncer: PgBouncer, database_url: str, stack: Stack, tmp_path: Path
) -> None:
    pooled = transaction_bouncer.url(database_url)
    worker = stack.worker(pooled, tmp_path, DATABASE_LISTEN_URL=pooled)
    _wait_notifications(worker, "unheard")
    assert _counter(worker.get("/metrics").text, "jobs_notifications_unheard_total") >= 1
    api = stack.api(pooled, DATABASE_LISTEN_URL=pooled)
    # The API's LISTEN connection is opened by the first waiter.
    first = _submit(api, {"type": "test.record"})
    _waited(api, first, 1)
    _wait_notifications(api, "unheard")
    assert _counter(api.get("/metrics").text, "jobs_notifications_unheard_total") >= 1
    for logs in (api.service.logs(), worker.logs()):
        warned = [line for line in logs if line.get("msg") == "notifications unheard"]
        assert warned and warned[0]["level"] == "warning", warned

    # Without the wake-ups, the worker's polling still runs every job.
    ids = [first] + [_submit(api, {"type": "test.record"}) for _ in range(5)]
    _all(api, ids, "completed", 30, "the jobs completed by polling")


OPTIONS = "?options=-c%20lock_timeout%3D1234"


@pytest.mark.parametrize("ignored", [False, True], ids=["refused", "ignored"])
async def test_options_in_database_url_are_refused_or_dropped_silently_by_pgbouncer(
    database_url: str, ignored: bool
) -> None:
    """A user's `options=-c ...` in DATABASE_URL, connected as the services connect: PgBouncer
    refuses the connection; with `ignore_startup_parameters = options` it connects, and the
    setting is gone without a word."""
    settings = {"ignore_startup_parameters": "options"} if ignored else None
    with PgBouncer(CURRENT, "transaction", default_pool_size=2, settings=settings) as bouncer:
        url = bouncer.url(database_url) + OPTIONS
        if not ignored:
            with pytest.raises(asyncpg.ProtocolViolationError, match="unsupported startup"):
                await asyncpg.connect(**connect_args(url))
            return
        conn = await asyncpg.connect(**connect_args(url))
        try:
            assert await conn.fetchval("SELECT current_setting('lock_timeout')") == "0"
        finally:
            await conn.close()
    # Straight to PostgreSQL the same URL's setting holds.
    direct = await asyncpg.connect(**connect_args(database_url + OPTIONS))
    try:
        assert await direct.fetchval("SELECT current_setting('lock_timeout')") == "1234ms"
    finally:
        await direct.close()
