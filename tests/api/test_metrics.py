"""/metrics: jobs_submitted_total counts creations only; durations are labelled by route."""

from __future__ import annotations

import uuid

import httpx
from prometheus_client.parser import text_string_to_metric_families


async def _samples(api: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = await api.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


async def _submitted(api: httpx.AsyncClient) -> float:
    return (await _samples(api))[("jobs_submitted_total", ())]


async def test_jobs_submitted_total_counts_creations_not_replays_or_rejections(
    api: httpx.AsyncClient,
):
    before = await _submitted(api)
    key = {"Idempotency-Key": "metrics-1"}
    assert (await api.post("/jobs", json={"type": "sleep"}, headers=key)).status_code == 201
    assert (await api.post("/jobs", json={"type": "sleep"}, headers=key)).status_code == 200
    conflict = await api.post("/jobs", json={"type": "webhook"}, headers=key)
    assert conflict.status_code == 409
    assert (await api.post("/jobs", json={"type": "nope"})).status_code == 400
    assert (await api.post("/jobs", json={"type": "sleep"})).status_code == 201
    assert await _submitted(api) == before + 2


async def test_request_durations_are_labelled_by_route_template_not_raw_path(
    api: httpx.AsyncClient,
):
    job_id = str(uuid.uuid4())
    await api.get(f"/jobs/{job_id}")
    await api.get(f"/jobs/{job_id}/status")
    await api.get(f"/no/such/{job_id}")
    samples = await _samples(api)
    counts = {
        dict(labels)["route"]: value
        for (name, labels), value in samples.items()
        if name == "http_request_duration_seconds_count"
    }
    assert counts["/jobs/{id}"] >= 1 and counts["/jobs/{id}/status"] >= 1
    assert "unmatched" in counts
    assert not any(job_id in route for route in counts)


async def test_process_metrics_are_exported(api: httpx.AsyncClient):
    names = {name for name, _ in await _samples(api)}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= names
