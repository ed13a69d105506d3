"""A PostgreSQL crash behind a transaction-mode PgBouncer shared by the API and a worker with
`WORKER_SYNCHRONOUS_COMMIT=off`: every submit the API acknowledged is still there after an
immediate-mode stop and a restart. (The worker's asynchronous commits must stay its own: a
`synchronous_commit = off` left on a server connection the pooler then lends to the API
would make the API's submits asynchronous too, and the crash would undo the last of them.)"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.cluster import Cluster
from tests.infra.pgbouncer import CURRENT, PgBouncer
from tests.infra.test_pgbouncer import Stack, _submit
from tests.procs import BIN

pytestmark = pytest.mark.e2e

SUBMITS = 40


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with Cluster(max_connections=50) as cluster:
        migrate = subprocess.run(
            [str(BIN / "jobqueue"), "migrate"],
            env={**os.environ, "DATABASE_URL": cluster.url()},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert migrate.returncode == 0, migrate.stdout + migrate.stderr
        yield cluster


def test_no_acknowledged_submit_is_lost_in_a_crash_behind_a_transaction_pooler(
    cluster: Cluster, stack: Stack, tmp_path: Path
) -> None:
    with PgBouncer(
        CURRENT,
        "transaction",
        server_port=cluster.port,
        default_pool_size=2,
        max_prepared_statements=100,
    ) as bouncer:
        pooled = bouncer.url(cluster.url())
        stack.worker(
            pooled,
            tmp_path,
            DATABASE_LISTEN_URL=cluster.url(),
            WORKER_SYNCHRONOUS_COMMIT="off",
            WORKERS="4",
        )
        api = stack.api(pooled, DATABASE_LISTEN_URL=cluster.url())
        # While the worker claims and completes them, committing asynchronously.
        acknowledged = [
            _submit(api, {"type": "test.record", "payload": {"seconds": 0.05}})
            for _ in range(SUBMITS)
        ]
        cluster.stop("immediate")
        cluster.start()
        cluster.wait_ready()
        with cluster.connect() as conn:
            rows = conn.execute(
                "SELECT id::text FROM jobqueue.jobs WHERE id = ANY(%s::uuid[])", (acknowledged,)
            ).fetchall()
        lost = set(acknowledged) - {row[0] for row in rows}
        assert not lost, f"{len(lost)} of {SUBMITS} acknowledged submits lost: {sorted(lost)}"
        stack.kill()
