"""The short chaos run inside `make test`: real processes, real faults, every invariant checked.

`make chaos` runs the long version with every fault kind; this one injects
one fault of each kind below (on a primary with a synchronous standby, for the
failover), and holds the MVCC horizon for the middle half of its 20 s of faults
(`tests.chaos.horizon`), while ~400 jobs (the routed mix: several queues,
priorities, some due seconds later, a few long jobs of 2-3 leases) are submitted
and about 5 % of them cancelled, some running, some pending, with the workers
deleting finished jobs 2 s after they finish; a quarter of them carry a concurrency key
(KEY_CONCURRENCY=*:2), and an operator pauses a queue three times, cancels a job type in
bulk and retries dead letters in bulk meanwhile (`tests.chaos.admin`); then checks.
"""

from __future__ import annotations

import random

import pytest

from tests.chaos.admin import PAUSES
from tests.chaos.load import QUEUE_MIX
from tests.chaos.run import run_chaos, table
from tests.chaos.system import LEASE_SECONDS

pytestmark = pytest.mark.chaos

SHORT_KINDS = [
    "pause",
    "pause_long",
    "kill_worker",
    "pg_restart_immediate",
    "terminate_backends",
    "proxy_blackhole",
    "hang_threads",
    "failover",
]
# Finished jobs are deleted 2 s after they finish, by the retention leader's rounds (every
# 30 s): the second comes about when the faults end. If that leader was killed, its lease
# (60 s) must run out first, so the run may wait that long for a first deletion.
SHORT_RETENTION = 2.0
PRUNE_WAIT = 100.0


@pytest.mark.timeout(480)
def test_faults_lose_no_acknowledged_job_and_every_stale_write_is_rejected() -> None:
    # Also: every cancel answer is kept, and retention deletes only finished jobs old enough.
    seed = random.randrange(1 << 31)
    report = run_chaos(
        jobs=400,
        duration=20,
        seed=seed,
        kinds=SHORT_KINDS,
        gap=(0.3, 0.8),
        retention=SHORT_RETENTION,
        await_prune=PRUNE_WAIT,
    )
    print(table(report))
    context = (
        f"seed {seed}; reproduce with python -m tests.chaos.run --jobs 400 --duration 20"
        f" --kinds {','.join(SHORT_KINDS)} --retention {SHORT_RETENTION:g}"
        f" --await-prune {PRUNE_WAIT:g} --seed {seed}"
    )
    assert report.violations == [], context
    summary = report.summary
    assert summary["lost"] == 0, context
    assert summary["never_ran"] == 0, context
    # The routed mix was exercised: every queue served, jobs due later started on time.
    assert summary["started_before_due"] == 0, context
    assert summary["scheduled_jobs"] >= 20, context
    assert set(summary["jobs_by_queue"]) == {name for name, _ in QUEUE_MIX}, context
    assert summary["jobs_submitted"] >= 400, context
    assert set(summary["faults_injected"]) == {*SHORT_KINDS, "held_horizon"}, context
    # The paused worker really was a stale writer: a newer claim held the job when its
    # write arrived, and only the lease-token condition stood in the way.
    assert summary["stale_writes_rejected_by_token"] >= 1, context
    # Long jobs ran, several leases each; the holder paused in the middle of one was stopped
    # by its own heartbeat once resumed.
    assert summary["long_jobs"]["jobs"] >= 1, context
    assert summary["long_jobs"]["longest_execution_seconds"] >= 2 * LEASE_SECONDS, context
    assert summary["paused_holders_stopped_by_renewal"] >= 1, context
    # Cancels were asked of pending and of running jobs, and some jobs ended cancelled.
    cancels = summary["cancels"]
    assert cancels["jobs"] >= 5, context
    assert cancels["answers"].get("200", 0) >= 1, context
    assert cancels["answers"].get("202", 0) >= 1, context
    assert cancels["ended_cancelled"] >= 1, context
    # The primary was killed and its synchronous standby promoted; the old primary came
    # back as the new one's synchronous standby.
    (failover,) = summary["failovers"]
    assert failover["recovered_seconds"] is not None and "rejoined_seconds" in failover, context
    # Keyed jobs ran (never more than the limit of one key at once: no violation), the queue
    # was paused and resumed, a job type cancelled in bulk.
    assert summary["keys"]["keyed_attempts"] >= 20, context
    assert summary["pauses"]["pauses"] == PAUSES, context
    assert summary["bulk"]["cancel_requests"] >= 1, context
    assert summary["bulk"]["bulk_type_ended_cancelled"] >= 1, context
    # Retention deleted acknowledged jobs, and the checker accounted for each of them.
    assert summary["retention"]["acknowledged_pruned"] >= 1, context
