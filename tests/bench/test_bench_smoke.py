"""`make bench` keeps working: the harness runs end to end on tiny sizes and reports every figure.

Timing belongs in the benchmark's output, not here: this only proves that each
measurement ran and produced a positive number, and that nothing is left behind.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench import features, pg
from bench.listing import COMBOS, PAGES
from bench.report import EXPECTED
from tests.pg import ROOT

pytestmark = pytest.mark.e2e

TINY = [
    "--jobs", "200",
    "--repeat", "1",
    "--processes", "1",
    "--workers", "10",
    "--sweep", "10",
    "--latency-samples", "10",
    "--e2e-jobs", "50",
    "--single-requests", "50",
    "--batch-jobs", "2000",
    "--backlog-completed", "2000",
    "--backlog-pending", "500",
    "--backlog-window", "200",
    "--backlog-skip", "20",
    "--claim-samples", "10",
    "--webhook-jobs", "100",
    "--schedule-samples", "20",
    "--list-rows", "3000",
    "--list-samples", "5",
    "--wait-samples", "20",
    "--wait-clients", "4",
    "--waiters", "50",
    "--retention-prefill", "6000",
    "--retention-churn", "3000",
    "--retention-cycled", "1500",
    "--client-jobs", "2000",
    "--features-prefill", "50000",
    "--fair-jobs", "1000",
]  # fmt: skip

OURS_FIGURES = {
    "drain_1proc_jobs_per_s",
    "bulk_enqueue_jobs_per_s",
    "e2e_jobs_per_s",
    "e2e_submit_jobs_per_s",
    "pickup_from_commit_p50_ms",
    "pickup_from_commit_p95_ms",
    "pickup_from_commit_p99_ms",
    "pickup_from_call_p50_ms",
    "pickup_from_call_p95_ms",
    "pickup_from_call_p99_ms",
    "drain_by_workers",
    "http_single",
    "http_batch_jobs_per_s",
}


def numbers(value: Any, path: str = "") -> list[tuple[str, float]]:
    if isinstance(value, dict):
        return [n for key, v in value.items() for n in numbers(v, f"{path}.{key}")]
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [(path, value)]
    return []


def bench_databases(server: str) -> set[str]:
    with psycopg.connect(server, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE starts_with(datname, 'jq_bench_')"
        )
        return {name for (name,) in rows}


def left_behind(server: str, before: set[str]) -> set[str]:
    """The benchmark databases created since `before` whose process has ended: another
    harness test running beside this one may hold its own for a while, but a database
    whose creator (named by the pid its name ends with) is gone was left behind."""
    return {
        name
        for name in bench_databases(server) - before
        if not pg._alive(int(name.rsplit("_", 1)[1]))
    }


# The run's own limit (the subprocess timeout below) applies, not the suite's default: on
# the 2-core machine under other load the tiny run takes up to about three minutes.
@pytest.mark.timeout(300)
def test_bench_reports_every_figure_for_our_queue(pg_server: str, tmp_path: Path) -> None:
    before = bench_databases(pg_server)
    run = subprocess.run(
        [sys.executable, "-m", "bench.queues", *TINY, "--server", pg_server,
         "--output-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Queue benchmarks" in run.stdout
    assert "[" in run.stderr  # the progress bar

    (path,) = tmp_path.glob("*.json")
    document = json.loads(path.read_text())
    assert document["errors"] == []
    summary = document["summary"]
    ours = summary["systems"]["jobqueue"]
    assert set(ours) >= OURS_FIGURES
    assert set(ours["drain_by_workers"]["10"]) == {"1proc_jobs_per_s"}
    assert {"jobs_per_s", "p50_ms", "p99_ms"} <= set(ours["http_single"])
    backlog = summary["backlog"]
    for table in ("empty", "backlog"):
        assert set(backlog[table]) == {"claim_p50_ms", "claim_p99_ms", "drain_jobs_per_s"}

    hooks = summary["webhooks"]
    assert hooks["jobs_per_s"] > 0 and hooks["worker_cpu_us_per_job"] >= 0
    assert hooks["retries"] == 0 and hooks["not_completed"] == 0
    assert "Webhooks:" in run.stdout

    routed = summary["scheduling"]
    assert set(routed["lateness"]) == {"1s", "5s"}
    for figures_ in routed["lateness"].values():
        assert figures_["samples"] == 20 and figures_["early"] == 0
        assert 0 <= figures_["earliest_ms"] <= figures_["p50_ms"] <= figures_["p99_ms"]
    two = routed["two_queues"]
    assert two["queues"] == "a,b" and two["jobs_per_s"] > 0 and two["ratio"] > 0
    assert "Scheduled jobs: lateness after run_at" in run.stdout
    assert "Two queues (QUEUES=a,b" in run.stdout

    priced = summary["costs"]
    beats, limits = priced["heartbeats"], priced["type_limits"]
    for pair in (beats, limits):
        assert pair["jobs_per_s"] > 0 and pair["without_jobs_per_s"] > 0 and pair["ratio"] > 0
        # CPU comes from /proc in 10 ms ticks: a tiny run may honestly measure 0.
        assert pair["worker_cpu_us_per_job"] >= 0 and pair["without_worker_cpu_us_per_job"] >= 0
    assert beats["leases_lost"] == 0
    assert limits["limited_finished_s"] > 0 and limits["others_finished_s"] > 0
    assert "Cost of heartbeats and per-type limits" in run.stdout
    assert "heartbeats, jobs of 50 ms: LEASE_DURATION=3s" in run.stdout
    assert "of the jobs limited, TYPE_CONCURRENCY=bench-limited:20" in run.stdout

    keyed = summary["keys"]
    drain_ = keyed["drain"]
    assert (drain_["jobs"], drain_["keys"], drain_["key_concurrency"]) == (200, 200, "*:2")
    assert drain_["jobs_per_s"] > 0 and drain_["keyless_jobs_per_s"] > 0 and drain_["ratio"] > 0
    assert drain_["worker_cpu_us_per_job"] >= 0
    fair = keyed["fairness"]
    assert (fair["a_jobs"], fair["b_jobs"], fair["samples"], fair["slots"]) == (1000, 20, 20, 16)
    assert 0 < fair["p50_ms"] <= fair["p99_ms"] <= fair["max_ms"]
    assert "Concurrency keys" in run.stdout
    assert "drain of 200 no-op jobs over 200 keys, KEY_CONCURRENCY=*:2" in run.stdout
    assert "fairness: 1,000 jobs of key A, 20 of key B 1 s later, 16 slots" in run.stdout

    listed = summary["listing"]
    assert listed["rows"] == 3000 and listed["limit"] == 50
    assert sum(listed["statuses"].values()) == 3000
    assert set(listed["combos"]) == set(COMBOS)
    for name, combo in listed["combos"].items():
        assert combo["indexes"] and not any(i.startswith("Seq Scan") for i in combo["indexes"])
        for page in PAGES:
            assert combo[page]["samples"] == 5, name
            assert 0 < combo[page]["p50_ms"] <= combo[page]["p99_ms"], name
    assert 0 < listed["queue_depths"]["p50_ms"] <= listed["queue_depths"]["p99_ms"]
    assert listed["worst_p99_ms"] > 0 and listed["worst"]
    assert "Listing: 3,000 jobs, pages of 50" in run.stdout
    assert "list page of 50 p99, every filter, first and deep page, 3,000 jobs" in run.stdout

    waited = summary["waiting"]
    answers = waited["latency"]
    assert answers["samples"] == 20 and answers["answered_completed"] == 20
    assert 0 < answers["p50_ms"] <= answers["p99_ms"] <= answers["max_ms"]
    assert 0 <= answers["notified"] <= 20
    many = waited["waiters"]
    assert many["waiters"] == many["answered"] == 50
    assert 0 < many["api_connections"] <= many["pool_size"] and many["listen_connections"] == 1
    assert many["from_finish"]["samples"] == 50
    drain = waited["drain"]
    assert drain["jobs_per_s"] > 0 and drain["without_jobs_per_s"] > 0 and drain["ratio"] > 0
    assert (drain["notifications"], drain["without_notifications"]) == (200, 0)
    assert "Waiting: GET /jobs/{id}?wait= on one jobqueue-api process" in run.stdout
    assert "50 concurrent waiters: 50 answered with the finished job" in run.stdout

    kept = summary["retention"]
    pruning = kept["pruning"]
    assert pruning["prefill"] == 6000 and pruning["pruned_by_keeping"] == 0
    assert pruning["jobs_per_s"] > 0 and pruning["without_jobs_per_s"] > 0
    assert pruning["worker_cpu_us_per_job"] >= 0 and pruning["pruned_during_drain"] >= 0
    assert 0 <= pruning["pruning_share"] <= 1
    churned = kept["churned"]
    assert churned["churn"] == 3000 and churned["cycled"] == 1500
    assert churned["all_moved_s"] > 0 and churned["retention_s"] > 0
    # The inserted finished jobs, spread over the 22 hours before the last one, expired.
    assert 0 < churned["expired"] <= 1500 and churned["pruned"] >= churned["expired"]
    for table in ("fresh", "churned"):
        assert set(churned[table]) == {
            "claim_p50_ms", "claim_p99_ms", "drain_jobs_per_s", "size_mb"
        }  # fmt: skip
        assert all(value > 0 for value in churned[table].values())
    assert "with 6,000 completed jobs a day old in the table" in run.stdout
    assert "3,000 jobs through one table with RETENTION_COMPLETED=24h" in run.stdout

    enqueued = summary["client"]
    for kind in ("enqueue_one", "enqueue_many", "submit_one", "submit_many"):
        assert enqueued[kind]["jobs"] == 2000 and enqueued[kind]["jobs_per_s"] > 0, kind
    assert 0 < enqueued["enqueue_one"]["batch_p50_ms"] <= enqueued["enqueue_one"]["batch_p99_ms"]
    assert "Client: enqueueing from Python" in run.stdout

    featured = summary["features"]
    assert (featured["processes"], featured["workers"], featured["jobs"]) == (1, 10, 200)
    assert featured["jobs_per_s"] > 0 and featured["worker_cpu_us_per_job"] >= 0
    assert featured["versus"]["jobqueue"]["ratio"] > 0
    assert featured["prefill"] == 50_000 and featured["pruning_throughout"]
    assert featured["leases_lost"] == 0 and featured["database_outages"] == 0
    assert summary["systems"][features.SYSTEM]["drain_1proc_jobs_per_s"] > 0
    assert f"{features.SYSTEM}: drain of 200 no-op jobs, 1 process(es)" in run.stdout

    # Every target has its line; only those against a peer (none ran here) and those of the
    # pressure scenarios (which `make bench` leaves to `make bench-compare`) were not measured.
    targets = summary["targets"]
    for part, _, _ in EXPECTED:
        assert [t for t in targets if part in t["target"]], part
    unmeasured = [t["target"] for t in targets if t["status"] == "not measured"]
    skipped = [
        t["target"]
        for t in targets
        if "PgQueuer" in t["target"] or "Procr" in t["target"] or t["target"].startswith("pressure")
    ]
    assert unmeasured == skipped
    loaded = ours["pickup_loaded_round_trip_p99_ms"], ours["pickup_loaded_from_commit_p99_ms"]
    assert loaded[0] > 0 and math.isfinite(loaded[1])
    assert "processes spinning on the CPU" in run.stdout
    table = run.stdout.split("\nTargets\n", 1)[1]
    assert table.count("\n  not measured  ") == sum(t["status"] == "not measured" for t in targets)

    figures = numbers(ours) + numbers({k: backlog[k] for k in ("empty", "backlog")})
    assert len(figures) >= 20
    # The submission's NOTIFY is delivered at its commit, so a worker may start the job
    # before the client has read the answer: pickup measured from the call's return can
    # be below zero. Every other figure is a positive number.
    from_commit = "_from_commit_"
    # CPU is read in clock ticks (10 ms): over 50 jobs the clients, or the worker's
    # processes (about 0.2 ms a job between them), may not have used one tick between the
    # two reads. PostgreSQL and the API always do, and every part's figure is a number.
    cpu = ".e2e_cpu_ms_per_job."
    not_positive = [
        (name, value)
        for name, value in figures
        if not (
            value > 0
            or (from_commit in name and math.isfinite(value))
            or (name.endswith((cpu + "bench client", cpu + "worker")) and value == 0)
        )
    ]
    assert not_positive == []
    e2e_cpu = ours["e2e_cpu_ms_per_job"]
    assert set(e2e_cpu) == {"api", "worker", "postgres", "bench client"}
    assert e2e_cpu["api"] > 0 and e2e_cpu["postgres"] > 0

    # Every database the run created is gone, and so is every process group it started.
    assert left_behind(pg_server, before) == set()
    assert document["process_groups"]
    assert [pgid for pgid in document["process_groups"] if alive(pgid)] == []


def alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
