"""`make bench-webhooks` keeps working: a real worker delivers webhooks to the bench's sink.

Only that it runs and reports; the rate belongs in the benchmark's output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pg import ROOT

pytestmark = pytest.mark.e2e


def test_webhook_bench_delivers_every_job_once_over_reused_connections(
    pg_server: str, tmp_path: Path
) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench.webhooks", "--quick", "--jobs", "300",
         "--server", pg_server, "--output-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "webhook jobs/s" in run.stdout

    (path,) = tmp_path.glob("webhooks-*.json")
    document = json.loads(path.read_text())
    (result,) = document["results"]
    assert result["sink_requests"] == result["jobs"] == 300  # each delivered once
    assert result["retries"] == 0 and result["not_completed"] == 0
    # The warm-up opened the worker's connections; the measured drain reused them.
    assert result["sink_new_connections"] == 0
    summary = document["summary"]
    assert summary["jobs_per_s"] > 0 and summary["worker_cpu_us_per_job"] > 0
    assert [pgid for pgid in document["process_groups"] if alive(pgid)] == []


def alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
