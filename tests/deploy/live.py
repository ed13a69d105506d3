"""What the real services export: a `jobqueue-api` and a `jobqueue-worker` run a few jobs to
every end (completed, retried, failed, dead-lettered, cancelled), then both are scraped."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.test_api_process import Api
from tests.procs import wait_for
from tests.worker.support import ROOT, start_worker

HANDLERS = {"JOB_HANDLERS": "tests.worker.handlers", "PYTHONPATH": str(ROOT)}
FINISHED = {"completed", "failed", "dead_letter", "cancelled"}
# Gauges set by the one worker process leading them, or per worker pod: a query takes their
# max across series (docs/operations.md), never their sum.
MAX_AGGREGATED = frozenset(
    {
        "jobs_queued",
        "jobs_oldest_pending_age_seconds",
        "jobs_retention_last_run_timestamp_seconds",
    }
)


@dataclass(frozen=True)
class Scrape:
    """Both services' `/metrics` pages, as served."""

    api: str
    worker: str

    def pages(self) -> dict[str, str]:
        return {"jobqueue-api": self.api, "jobqueue-worker": self.worker}


def scrape(database_url: str, tmp_path: Path) -> Scrape:
    api = Api(database_url, **HANDLERS)
    worker = start_worker(database_url, tmp_path, BACKOFF_BASE="0.1s", BACKOFF_MAX="0.1s")
    try:
        api.wait_ready()
        wait_for(lambda: worker.status_of("/readyz") == 200, 60, "jobqueue-worker ready")
        ends = {
            "completed": submit(api, {"type": "test.record"}),
            "failed": submit(api, {"type": "test.permanent"}),
            "dead_letter": submit(api, {"type": "test.fail", "max_attempts": 2}),
        }
        later = submit(api, {"type": "test.record", "delay": "1h"})
        assert api.post(f"/jobs/{later}/cancel").status_code == 200
        assert api.post("/jobs", json={"type": "no.such.type"}).status_code == 400
        for status, job_id in ends.items():
            wait_for(lambda job_id=job_id: finished(api, job_id), 60, f"a job {status}")
            assert api.get(f"/jobs/{job_id}").json()["status"] == status
        # The leader's gauges show the cancelled job's queue; retention has run once.
        wait_for(
            lambda: all(
                name in worker.get("/metrics").text
                for name in ("jobs_queued{", "jobs_retention_last_run_timestamp_seconds ")
            ),
            60,
            "the queue gauges and a retention run",
        )
        return Scrape(api=api.get("/metrics").text, worker=worker.get("/metrics").text)
    finally:
        for service in (api.service, worker):
            if service.proc.poll() is None:
                service.stop(60)


def submit(api: Api, job: dict[str, object]) -> str:
    created = api.post("/jobs", json=job)
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def finished(api: Api, job_id: str) -> bool:
    return api.get(f"/jobs/{job_id}").json()["status"] in FINISHED


def exposed(page: str) -> dict[str, str]:
    """{sample name: family type} of an exposition page, without the `_created` samples
    prometheus-client adds beside counters and histograms (not something to query)."""
    samples = [
        (sample.name, family.type)
        for family in text_string_to_metric_families(page)
        for sample in family.samples
    ]
    names = {name for name, _ in samples}

    def created(name: str) -> bool:
        base = name.removesuffix("_created")
        return name != base and bool({f"{base}_total", f"{base}_count"} & names)

    return {name: kind for name, kind in samples if not created(name)}
