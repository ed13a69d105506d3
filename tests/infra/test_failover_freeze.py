"""A primary that hangs instead of dying, under load: every process of its cluster stopped
(SIGSTOP: its sockets stay open and nothing answers, no reset), then its synchronous
standby promoted. The API and the worker must leave the silent connections, find the
promoted standby without a restart, lose no acknowledged job and run no claim twice."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest

from tests.e2e.test_api_process import Api
from tests.infra.replication import Pair, freeze, kill_cluster, promote
from tests.infra.traffic import Traffic, all_completed, states
from tests.procs import wait_for
from tests.worker.support import Worker, read_tokens, start_worker

pytestmark = pytest.mark.e2e

# The contract: submits answer 201 and new jobs complete within this many seconds of the
# promotion.
RECOVERY = 30.0
STARTUP = 60.0
# Jobs running when the primary hung keep their lease (30 s) through the fault, or are
# taken back once it ran out and run again (under a new token): done within this.
SETTLED = 60.0


def test_a_hung_primary_is_left_for_the_promoted_standby_under_load(
    pair: Pair, tmp_path: Path
) -> None:
    url = pair.url()
    api = Api(url, JOB_TYPES="test.fenced")
    worker: Worker | None = None
    traffic: Traffic | None = None
    frozen = False
    try:
        worker = start_worker(url, tmp_path, WORKERS="4")
        api.wait_ready()
        wait_for(lambda: worker.status_of("/readyz") == 200, STARTUP, "the worker ready")
        api_pid, worker_pid, children = api.service.proc.pid, worker.proc.pid, worker.child_pids()

        listens = len(wait_for(lambda: worker.messages("listening for wake-ups"), 10, "listening"))
        traffic = Traffic(api.base).start()
        # Under load: jobs acknowledged, some done, some running, when the primary hangs.
        wait_for(lambda: len(read_tokens(worker.exec_log)) >= 10, 30, "jobs running")
        freeze(pair.primary)
        frozen = True
        hung = time.monotonic()
        # What the standby (readable) holds of the jobs acknowledged so far: some not done.
        held = states(pair.standby, traffic.acknowledged())
        in_flight = collections.Counter(status for status in held.values() if status != "completed")
        assert in_flight, held

        # Nothing answers, nothing resets: both services notice on their own.
        wait_for(lambda: api.status_of("/readyz") == 503, 20, "the API's /readyz 503")
        wait_for(lambda: worker.status_of("/readyz") == 503, 20, "the worker's /readyz 503")
        noticed = time.monotonic() - hung

        promote(pair.standby)
        promoted = time.monotonic()
        wait_for(lambda: traffic.acknowledged(promoted), RECOVERY, "a submit answered 201")
        first_201 = time.monotonic() - promoted
        # A job acknowledged after the promotion completes, within the same 30 s.
        wait_for(
            lambda: all_completed(pair.standby, traffic.acknowledged(promoted)[:1]),
            RECOVERY - (time.monotonic() - promoted),
            "a job submitted after the promotion completed",
            interval=0.2,
        )
        back = time.monotonic() - promoted
        # The LISTEN connection, silent since the hang, was given up: wake-ups are heard
        # from the new primary.
        wait_for(
            lambda: len(worker.messages("listening for wake-ups")) > listens,
            RECOVERY - (time.monotonic() - promoted),
            "the worker listening again",
        )
        # More load on the new primary, then the run settles.
        wait_for(lambda: len(traffic.acknowledged(promoted)) >= 30, 30, "submits after")
        traffic.stop()
        every = traffic.acknowledged()
        wait_for(
            lambda: all_completed(pair.standby, every),
            SETTLED,
            "every acknowledged job completed",
            interval=0.5,
        )
        settled = time.monotonic() - promoted

        # Every job that got a 201 is there and completed; every one ran; no claim (job,
        # lease token) ran twice.
        assert set(states(pair.standby, every).values()) == {"completed"}
        tokens = read_tokens(worker.exec_log)
        ran = collections.Counter((job_id, token) for job_id, token, _pid in tokens)
        twice = {claim: n for claim, n in ran.items() if n > 1}
        assert not twice, twice
        assert set(every) <= {job_id for job_id, _token in ran}

        # The same processes throughout.
        assert api.service.proc.poll() is None and api.service.proc.pid == api_pid
        assert worker.proc.poll() is None and worker.proc.pid == worker_pid
        assert worker.child_pids() == children
        assert not worker.messages("worker process died, restarting")
        assert not [line for line in api.service.logs() if line.get("level") == "error"]

        # The hung machine is gone for good: its connections reset at last, and the
        # services go on.
        kill_cluster(pair.primary)
        frozen = False
        after = Traffic(api.base, threads=1).start()
        wait_for(lambda: len(after.acknowledged()) >= 5, 10, "submits after the kill")
        after.stop()
        wait_for(lambda: all_completed(pair.standby, after.acknowledged()), 10, "jobs after")
        print(
            f"\nfreeze: {len(every)} acknowledged, answers {traffic.statuses()}, "
            f"{len(tokens)} runs ({len(ran)} claims), not done at the freeze {dict(in_flight)}, "
            f"unready after {noticed:.1f}s; "
            f"after the promotion: first 201 {first_201:.1f}s, a new job done {back:.1f}s, "
            f"all done {settled:.1f}s"
        )
    finally:
        if traffic is not None:
            traffic.stop()
        if frozen:
            kill_cluster(pair.primary)
        for service in (api.service, worker):
            if service is not None and service.proc.poll() is None:
                service.kill()
