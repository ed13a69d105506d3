"""The worker's `/metrics` sums its processes' counters, even across a restart."""

from __future__ import annotations

import os
import signal

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.worker.support import all_in, eventually, read_log, start_worker, submit, until

pytestmark = pytest.mark.e2e


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_metrics_report_the_true_totals_of_all_worker_processes(
    database_url, engine, tmp_path
):
    worker = start_worker(
        database_url, tmp_path, WORKER_PROCESSES="2", WORKERS="2", BACKOFF_BASE="60s"
    )
    try:
        await until(lambda: len(worker.child_pids()) == 2, 90, "two worker processes")
        completed = await submit(engine, "test.record", {"seconds": 0.05}, count=40)
        failed = await submit(engine, "test.permanent", count=3)
        retried = await submit(engine, "test.fail", max_attempts=2, count=2)
        dead = await submit(engine, "test.fail", max_attempts=1)
        await eventually(lambda: all_in(engine, completed, "completed"), 90, "40 completed")
        await eventually(lambda: all_in(engine, failed, "failed"), 30, "3 failed")
        await eventually(lambda: all_in(engine, dead, "dead_letter"), 30, "1 dead_letter")
        await eventually(lambda: all_in(engine, retried, "pending"), 30, "2 retried")
        runs = [row for row in read_log(worker.exec_log) if row[0] == "run"]
        assert len({pid for _, _, _, pid in runs}) == 2  # both processes did part of the work

        # A process that dies takes its counts with it unless they are kept: kill one.
        victim = worker.child_pids()[0]
        os.kill(victim, signal.SIGKILL)
        await until(lambda: len(worker.child_pids()) == 3, 90, "the replacement process")
        await until(lambda: worker.status_of("/readyz") == 200, 30, "ready again")

        response = worker.get("/metrics")
        assert response.status_code == 200
        samples = _samples(response.text)
        assert samples[("jobs_completed_total", ())] == 40
        assert samples[("jobs_failed_total", (("status", "failed"),))] == 3
        assert samples[("jobs_failed_total", (("status", "dead_letter"),))] == 1
        assert samples[("jobs_retried_total", ())] == 2
        assert samples[("jobs_recovered_total", ())] == 0
        histogram = {
            labels: value
            for (name, labels), value in samples.items()
            if name == "job_processing_duration_seconds_count"
        }
        assert histogram[(("outcome", "completed"),)] == 40
        assert sum(histogram.values()) == 40 + 3 + 1 + 2
        assert samples[("worker_processes", ())] == 2
        assert samples[("worker_process_restarts_total", ())] == 1
        assert ("process_cpu_seconds_total", ()) in samples

        assert worker.get("/healthz").json() == {"status": "ok"}
        missing = worker.get("/nope")
        assert missing.status_code == 404 and "error" in missing.json()
    finally:
        assert worker.stop(60) == 0
