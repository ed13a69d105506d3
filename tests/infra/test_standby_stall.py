"""A synchronous standby that stops answering holds every commit on the primary: a claim
made meanwhile is answered only once it is back, after the lease the claim took ran out.
The worker must not start such a job (recovery may take it back and run it elsewhere at
once); it runs, once, under a later claim."""

from __future__ import annotations

import collections
import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.test_api_process import Api
from tests.infra.replication import Pair, freeze, kill_all
from tests.procs import wait_for
from tests.worker.support import Worker, read_tokens, start_worker

pytestmark = pytest.mark.e2e

LEASE = 3.0
DUE_IN = 2.0  # the jobs' delay: their claims come while the standby is stopped
HELD = LEASE + 1.5  # how long the claims' commits wait, past the lease they took
JOBS = 6


def test_a_claim_answered_after_its_lease_ran_out_runs_nothing(pair: Pair, tmp_path: Path) -> None:
    url = pair.url()
    api = Api(url, JOB_TYPES="test.fenced")
    worker: Worker | None = None
    frozen: list[int] = []
    try:
        # Two processes: one's recovery takes back what the other's late claim took.
        worker = start_worker(
            url,
            tmp_path,
            WORKER_PROCESSES="2",
            WORKERS="4",
            LEASE_DURATION=f"{LEASE:g}s",
            RECOVERY_INTERVAL="1s",
        )
        api.wait_ready()
        wait_for(lambda: worker.status_of("/readyz") == 200, 60, "the worker ready")
        body = {"type": "test.fenced", "payload": {"seconds": 2}, "delay": f"{DUE_IN:g}s"}
        ids = []
        for _ in range(JOBS):
            created = api.post("/jobs", json=body)
            assert created.status_code == 201, created.text
            ids.append(created.json()["id"])
        submitted = time.monotonic()
        frozen = freeze(pair.standby)
        time.sleep(max(0.0, submitted + DUE_IN + HELD - time.monotonic()))  # the fault
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        frozen = []

        def ran() -> dict[str, list[int]]:
            tokens = collections.defaultdict(list)
            for job_id, token, _pid in read_tokens(worker.exec_log):
                tokens[job_id].append(token)
            return tokens

        wait_for(lambda: set(ran()) >= set(ids), 30, "every job run")
        # Every job ran once: never under a lease that had run out as well as under the next.
        assert all(len(tokens) == 1 for tokens in ran().values()), ran()
        # A late claim was made, and ran nothing: its job ran under a later token only.
        assert any(min(tokens) > 1 for tokens in ran().values()), ran()
        assert worker.messages("lease lost, attempt stopped"), worker.output()
    finally:
        kill_all(frozen)
        for service in (api.service, worker):
            if service is not None and service.proc.poll() is None:
                service.kill()
