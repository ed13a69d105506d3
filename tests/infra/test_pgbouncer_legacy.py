"""The services through a PgBouncer older than 1.21 (Debian 12's 1.18), which does not carry
prepared statements across the server connections it lends in transaction mode: in session
mode they run, at one server connection per connection of theirs; in transaction mode their
statements fail with asyncpg's `prepared statement "__asyncpg_stmt_…__" does not exist` (or
`already exists`), and they say so with what to do, instead of failing silently."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from jobcore.errors import POOLER_HINT
from tests.e2e.test_api_process import Api
from tests.infra.pgbouncer import LEGACY, PgBouncer
from tests.infra.test_pgbouncer import TYPES, Stack, _database, _submit, _waited
from tests.procs import Service, wait_for
from tests.worker.support import start_worker

pytestmark = pytest.mark.e2e

PREPARED = 'prepared statement "__asyncpg_stmt_'


def _hinted(service: Service) -> list[dict[str, Any]]:
    """The log lines of `service` that report asyncpg's prepared statement error with what
    to do about it."""
    return [
        line
        for line in service.logs()
        if any(isinstance(v, str) and PREPARED in v and POOLER_HINT in v for v in line.values())
    ]


def _legacy(mode: str, pool_size: int) -> PgBouncer:
    bouncer = PgBouncer(LEGACY, mode, default_pool_size=pool_size)
    return bouncer


def test_in_session_mode_the_services_run_through_pgbouncer_1_18_a_server_connection_each(
    database_url: str, stack: Stack, tmp_path: Path
) -> None:
    with _legacy("session", 30) as legacy:
        (version,) = legacy.show("VERSION")
        assert version["version"].startswith("PgBouncer 1.18"), version
        pooled = legacy.url(database_url)
        stack.worker(pooled, tmp_path, DATABASE_LISTEN_URL=database_url)
        api = stack.api(pooled, DATABASE_LISTEN_URL=database_url)
        ids = [_submit(api, {"type": "test.record"}) for _ in range(5)]
        for job_id in ids:
            assert _waited(api, job_id, 20)["status"] == "completed"
        database = _database(database_url)
        assert legacy.stats(database)["total_xact_count"] > 20
        # What session mode costs: every connection of the services holds a server
        # connection of its own for its whole life, as without a pooler.
        clients = [c for c in legacy.show("CLIENTS") if c["database"] == database]
        servers = [s for s in legacy.show("SERVERS") if s["database"] == database]
        assert len(clients) >= 3 and len(servers) >= len(clients) - 1, (clients, servers)


def test_in_transaction_mode_through_pgbouncer_1_18_the_services_say_what_to_do(
    database_url: str, stack: Stack, tmp_path: Path
) -> None:
    with _legacy("transaction", 2) as legacy:
        pooled = legacy.url(database_url)
        worker = start_worker(pooled, tmp_path, DATABASE_LISTEN_URL=database_url)
        stack.services.append(worker)
        found = wait_for(lambda: _hinted(worker), 30, "the worker's error, with what to do")
        assert found[0]["msg"] == "database unavailable", found[0]

        api = Api(pooled, DATABASE_LISTEN_URL=database_url, JOB_TYPES=TYPES)
        stack.services.append(api.service)

        def refused() -> bool:
            if api.service.proc.poll() is not None:
                return True  # at startup: one line, exit 1
            try:
                answer = api.post("/jobs", json={"type": "test.record"})
            except httpx.TransportError:
                return False  # not listening yet
            if answer.status_code == 503:
                assert answer.json() == {"error": "database unusable through its pooler"}
                return True
            return False

        wait_for(refused, 30, "the API to refuse", interval=0.1)
        if api.service.proc.poll() is not None:
            assert api.service.proc.returncode == 1
            errors = [line for line in api.service.logs() if line.get("level") == "error"]
            assert len(errors) == 1 and POOLER_HINT in errors[0]["msg"], errors
        else:
            # The line is written as the answer goes out: read until it is there.
            wait_for(
                lambda: any(POOLER_HINT in line.get("msg", "") for line in api.service.logs()),
                10,
                "the API's error line with what to do",
            )
