"""A rolling deploy: the API accepts a type before any worker has its code. A worker without a
handler for it gives its jobs back (pending, the attempt not spent, one entry in `errors`,
counted in `jobs_unhandled_total`, warned of once), never fails them; the first worker that
has the handler runs them to `completed`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.rollout_handlers import NEW_TYPE
from tests.worker.support import Worker, start_worker, until

pytestmark = pytest.mark.e2e


def _unhandled(worker: Worker, job_type: str) -> float:
    for family in text_string_to_metric_families(worker.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "jobs_unhandled_total" and sample.labels == {"type": job_type}:
                return sample.value
    return 0.0


async def test_a_type_new_to_the_workers_waits_for_one_that_has_its_handler(
    database_url: str, tmp_path: Any, start_api: Callable[..., Any]
):
    # The submitters learn of the type before any worker has its code: the API imports none.
    api = start_api(JOB_TYPES=NEW_TYPE)
    created = api.post("/jobs", json={"type": NEW_TYPE, "max_attempts": 1})
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]

    def record() -> dict[str, Any]:
        return api.get(f"/jobs/{job_id}").json()

    # The previous release's worker: its handlers lack the new type.
    old = start_worker(database_url, tmp_path)
    try:
        await until(lambda: record()["errors"], 60, "the old worker gave the job back")
        await until(lambda: _unhandled(old, NEW_TYPE) >= 1, 10, "the give-back counted")
    finally:
        assert old.stop(60) == 0
    given_back = record()
    # Given back, not failed: pending, and its only attempt still to come.
    assert given_back["status"] == "pending" and given_back["attempts"] == 0
    error = f"no handler for type {NEW_TYPE!r} in this worker"
    assert given_back["last_error"] == error
    entries = given_back["errors"]
    assert [(e["attempt"], e["error"], e["traceback"]) for e in entries] == [
        (1, error, None)
    ] * len(entries)
    warned = [
        line
        for line in old.logs()
        if line.get("level") == "warning" and line.get("job_type") == NEW_TYPE
    ]
    assert len(warned) == 1 and "no handler" in warned[0]["msg"]  # once a minute per type

    # The new release's worker has the handler: the job runs, on its one attempt.
    new = start_worker(
        database_url,
        tmp_path,
        JOB_HANDLERS="tests.worker.handlers,tests.e2e.rollout_handlers",
    )
    try:
        await until(lambda: record()["status"] == "completed", 90, "the new worker ran it")
    finally:
        assert new.stop(60) == 0
    done = record()
    assert done["attempts"] == 1 and done["result"] == {"attempt": 1}
    assert done["errors"] == entries  # a success adds none
