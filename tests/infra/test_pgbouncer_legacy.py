"""The services through a PgBouncer older than 1.21 (Debian 12's 1.18) in transaction mode,
which does not carry prepared statements across the server connections it lends:
`statement_cache_size=0` in `DATABASE_URL` lets them run; without it their statements fail
with asyncpg's `prepared statement "__asyncpg_stmt_…__" does not exist` (or `already
exists`) as they land on another server connection than the one that prepared them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_api_process import Api
from tests.infra.pgbouncer import LEGACY, PgBouncer
from tests.infra.test_pgbouncer import TYPES, Stack, _database, _submit, _waited
from tests.procs import Service, wait_for
from tests.worker.support import start_worker

pytestmark = pytest.mark.e2e

PREPARED = 'prepared statement "__asyncpg_stmt_'


def _prepared_errors(service: Service) -> list[dict[str, Any]]:
    """The log lines of `service` that carry asyncpg's prepared statement error."""
    return [
        line
        for line in service.logs()
        if any(isinstance(v, str) and PREPARED in v for v in line.values())
    ]


@pytest.fixture
def legacy() -> Iterator[PgBouncer]:
    with PgBouncer(LEGACY, "transaction", default_pool_size=2) as bouncer:
        (version,) = bouncer.show("VERSION")
        assert version["version"].startswith("PgBouncer 1.18"), version
        yield bouncer


@pytest.fixture
def stack() -> Iterator[Stack]:
    stack = Stack()
    try:
        yield stack
    finally:
        stack.kill()


def test_statement_cache_size_0_lets_the_services_run_through_pgbouncer_1_18(
    legacy: PgBouncer, database_url: str, stack: Stack, tmp_path: Path
) -> None:
    pooled = legacy.url(database_url) + "?statement_cache_size=0"
    worker = stack.worker(pooled, tmp_path, DATABASE_LISTEN_URL=database_url)
    api = stack.api(pooled, DATABASE_LISTEN_URL=database_url)
    ids = [_submit(api, {"type": "test.record"}) for _ in range(5)]
    for job_id in ids:
        assert _waited(api, job_id, 20)["status"] == "completed"
    assert legacy.stats(_database(database_url))["total_xact_count"] > 20
    assert not _prepared_errors(api.service) and not _prepared_errors(worker)
    errors = [line for line in api.service.logs() if line.get("level") == "error"]
    assert not errors, errors


def test_without_statement_cache_size_the_services_fail_on_prepared_statements(
    legacy: PgBouncer, database_url: str, stack: Stack, tmp_path: Path
) -> None:
    pooled = legacy.url(database_url)
    worker = start_worker(pooled, tmp_path, DATABASE_LISTEN_URL=database_url)
    stack.services.append(worker)
    found = wait_for(lambda: _prepared_errors(worker), 20, "the worker's prepared statement errors")
    assert found[0]["msg"] == "database unavailable", found[0]

    api = Api(pooled, DATABASE_LISTEN_URL=database_url, JOB_TYPES=TYPES)
    stack.services.append(api.service)

    def failed() -> bool:
        if api.service.proc.poll() is not None:
            return True
        try:
            answer = api.post("/jobs", json={"type": "test.record"})
        except httpx.TransportError:
            return False  # not listening yet
        return answer.status_code >= 500

    wait_for(failed, 20, "the API to fail", interval=0.1)
    assert _prepared_errors(api.service), api.service.output()
