"""After a failover, the failed primary comes back as a standby of the promoted one:
rewound (pg_rewind), pointed at the new primary, streaming from it and then its
synchronous standby, while the services, whose URL still names it first, keep working on
the new primary without a restart and never keep a session on it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.chaos.cluster import Cluster
from tests.e2e.test_api_process import Api
from tests.infra.replication import (
    REJOINED_NAME,
    Pair,
    kill_cluster,
    make_synchronous,
    promote,
    rejoin,
    replication_state,
)
from tests.infra.traffic import Traffic, all_completed, states
from tests.procs import wait_for
from tests.worker.support import Worker, read_tokens, start_worker

pytestmark = pytest.mark.e2e

RECOVERY = 30.0
STARTUP = 60.0


def _sessions(cluster: Cluster) -> set[str]:
    """The roles (application names less the revision) of the services' sessions there."""
    with cluster.connect() as conn:
        rows = conn.execute(
            "SELECT application_name FROM pg_stat_activity"
            " WHERE application_name LIKE 'jobqueue%%' AND pid <> pg_backend_pid()"
        ).fetchall()
    return {str(name).partition("/")[0] for (name,) in rows}


def test_the_failed_primary_rejoins_as_a_standby_of_the_promoted_one(
    pair: Pair, tmp_path: Path
) -> None:
    old, new = pair.primary, pair.standby
    url = pair.url()  # the old primary first, as before the failover
    api = Api(url, JOB_TYPES="test.fenced")
    worker: Worker | None = None
    traffic: Traffic | None = None
    try:
        worker = start_worker(url, tmp_path, WORKERS="4")
        api.wait_ready()
        wait_for(lambda: worker.status_of("/readyz") == 200, STARTUP, "the worker ready")
        api_pid, worker_pid, children = api.service.proc.pid, worker.proc.pid, worker.child_pids()

        traffic = Traffic(api.base).start()
        wait_for(lambda: len(read_tokens(worker.exec_log)) >= 10, 30, "jobs running")
        kill_cluster(old)  # no shutdown at all
        promote(new)
        promoted = time.monotonic()
        wait_for(lambda: traffic.acknowledged(promoted), RECOVERY, "a submit answered 201")
        wait_for(
            lambda: all_completed(new, traffic.acknowledged(promoted)[:1]),
            RECOVERY,
            "a job submitted after the promotion completed",
            interval=0.2,
        )

        # The old primary, rewound, streams from the new one, under the same load.
        started = time.monotonic()
        rejoin(old, new)
        rejoined = time.monotonic()
        wait_for(
            lambda: replication_state(new, REJOINED_NAME) == ("streaming", "async"),
            30,
            "the rejoined standby streaming",
            interval=0.2,
        )
        make_synchronous(new, REJOINED_NAME)
        synchronous = time.monotonic() - rejoined
        with old.connect() as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)

        wait_for(lambda: len(traffic.acknowledged(rejoined)) >= 30, 30, "submits after")
        traffic.stop()
        since = [a for a in traffic.answers if a.at > rejoined]
        # Not one submit after the rejoin refused: none landed on the standby named first.
        assert {a.status for a in since} == {201}, traffic.statuses()
        every = traffic.acknowledged()
        wait_for(lambda: all_completed(new, every), 60, "every acknowledged job completed")
        # Written on the new primary, streamed to the rejoined standby.
        wait_for(lambda: all_completed(old, every), 10, "the jobs on the rejoined standby")
        assert _sessions(new) >= {"jobqueue-api", "jobqueue-worker"}
        assert _sessions(old) == set()

        assert api.service.proc.poll() is None and api.service.proc.pid == api_pid
        assert worker.proc.poll() is None and worker.proc.pid == worker_pid
        assert worker.child_pids() == children
        assert not [line for line in api.service.logs() if line.get("level") == "error"]
        print(
            f"\nrejoin: {len(every)} acknowledged ({len(since)} after the rejoin, all 201), "
            f"answers {traffic.statuses()}; rewound and started in {rejoined - started:.1f}s, "
            f"synchronous {synchronous:.1f}s later; on it {len(states(old, every))} of the jobs"
        )
    finally:
        if traffic is not None:
            traffic.stop()
        for service in (api.service, worker):
            if service is not None and service.proc.poll() is None:
                service.kill()
