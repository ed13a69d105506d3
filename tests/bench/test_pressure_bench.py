"""`make bench-pressure` keeps working: `--quick` runs every scenario end to end against the
real services and reports every phase.

Only that it runs and reports positive figures; whether the queue held up belongs in the
benchmark's output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.pressure import SCENARIOS
from bench.pressure_report import PHASES
from tests.bench.test_bench_smoke import alive, bench_databases, left_behind
from tests.pg import ROOT

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(420)
def test_pressure_bench_reports_every_phase_of_every_scenario(
    pg_server: str, tmp_path: Path
) -> None:
    before = bench_databases(pg_server)
    out = tmp_path / "pressure.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench.pressure", "--quick", "--server", pg_server,
         "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"JSON: {out}" in run.stdout

    document = json.loads(out.read_text())
    assert document["errors"] == []
    assert list(document["scenarios"]) == list(SCENARIOS)
    rows = {tuple(line.split()[:2]) for line in run.stdout.splitlines()}
    for name, scenario in document["scenarios"].items():
        assert list(scenario["phases"]) == list(PHASES)
        for phase, f in scenario["phases"].items():
            assert (name, phase) in rows
            where = f"{name}/{phase}"
            assert f["offered_per_s"] > 0 and f["accepted_per_s"] > 0, where
            assert f["completed_per_s_median"] > 0, where
            assert f["claim_samples"] > 0, where
            assert 0 < f["claim_p50_ms"] <= f["claim_p99_ms"], where
            assert f["backlog_max"] >= f["backlog_end"] >= 0, where
            kinds = {r["kind"] for r in f["relations"]}
            assert kinds == {"table", "index"}, where
            assert scenario["jobs_relation"] in {r["name"] for r in f["relations"]}, where
        assert scenario["failed_jobs"] == 0 and scenario["database_outages"] == 0
        assert all(v is not None and v > 0 for v in scenario["ratios"].values()), name
        after = scenario["dead_tuples_recovered_s"]
        assert after is None or after >= 0
        vacuumed = scenario["first_vacuum_after_release_s"]
        assert vacuumed is None or vacuumed >= 0
        verdict = "not within the phase" if after is None else "s after the release"
        jobs = document["jobs_table"]
        assert f"{name}: {jobs} dead tuples under 10,000: " in run.stdout and verdict in run.stdout
    assert document["scenarios"]["idle-xid"]["holder"]["xid"] > 0
    assert document["scenarios"]["repeatable-read"]["holder"]["counts"] > 0
    assert document["scenarios"]["rate-1.5x"]["phases"]["pressure"]["target_rate"] == 300

    # Every database the run created is gone, and so is every process group it started.
    assert left_behind(pg_server, before) == set()
    assert document["process_groups"]
    assert [pgid for pgid in document["process_groups"] if alive(pgid)] == []
