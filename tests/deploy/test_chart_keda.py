"""The chart's KEDA option: a ScaledObject for the worker Deployment whose PostgreSQL trigger
counts the due jobs of the served queues (run here on a real table, through the claim index),
with the workers' own DATABASE_URL; never beside the CPU autoscaler."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import asyncpg
import helm_python as helm
import pytest

from bench.listing import FILL
from tests import pg
from tests.deploy.script import validate_deploy
from tests.deploy.test_chart import container, only
from tests.jobcore.test_query_plans import _nodes

Manifest = dict[str, Any]
render = validate_deploy.render_chart
find = validate_deploy.find
KEDA = {"keda": {"enabled": True}}
ROWS = 50_000  # bench.listing's mix: mostly finished jobs, the newest pending or running


def query_of(manifests: list[Manifest]) -> str:
    (trigger,) = only(manifests, "ScaledObject")["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    query: str = trigger["metadata"]["query"]
    return query


def test_no_keda_objects_by_default(default_manifests: list[Manifest]) -> None:
    for kind in ("ScaledObject", "TriggerAuthentication"):
        assert find(default_manifests, kind) == []


def test_the_scaled_object_owns_the_worker_replicas_within_its_bounds() -> None:
    manifests = render({"keda": {"enabled": True, "minReplicaCount": 3, "maxReplicaCount": 30}})
    worker = only(manifests, "Deployment", "-worker")
    scaled = only(manifests, "ScaledObject")["spec"]
    assert scaled["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": worker["metadata"]["name"],
    }
    assert "replicas" not in worker["spec"]  # a rollout must not reset KEDA's count
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (3, 30)
    assert find(manifests, "HorizontalPodAutoscaler") == []  # KEDA makes its own
    (trigger,) = scaled["triggers"]
    assert trigger["metadata"]["targetQueryValue"] == "20"  # metadata values are strings
    down = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 60}]


@pytest.mark.parametrize("existing", ["", "jobqueue-database"])
def test_keda_connects_with_the_workers_own_database_url(existing: str) -> None:
    manifests = render({**KEDA, "secret": {"existingSecret": existing}})
    (trigger,) = only(manifests, "ScaledObject")["spec"]["triggers"]
    auth = only(manifests, "TriggerAuthentication")
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    (ref,) = [
        e["valueFrom"]["secretKeyRef"]
        for e in container(only(manifests, "Deployment", "-worker"))["env"]
        if e["name"] == "DATABASE_URL"
    ]
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "connection", "name": ref["name"], "key": ref["key"]}
    ]
    assert ref["name"] == (existing or "jobqueue")


def test_keda_beside_the_cpu_autoscaler_stops_the_render() -> None:
    with pytest.raises(helm.HelmError, match=r"keda\.enabled and worker\.autoscaling\.enabled"):
        render({**KEDA, "worker": {"autoscaling": {"enabled": True}}})


@pytest.mark.parametrize(
    "values",
    [
        {"keda": {"enabled": True, "minReplicaCount": 0}},  # nothing would recover or prune
        {"keda": {"enabled": True, "targetQueryValue": 0}},
        {"keda": {"enabled": True, "pollingInterval": "15s"}},
        {"keda": {"enabled": True, "replicas": 3}},
        {"config": {"QUEUES": "default') OR (1 = 1"}},
        {"config": {"QUEUES": "Mail"}},
    ],
)
def test_bad_keda_values_stop_the_render(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmError):
        render(values)


@pytest.mark.parametrize(
    ("queues", "listed"),
    [
        (None, "'default'"),
        ("default", "'default'"),
        ("critical:2, bulk,default:8", "'critical', 'bulk', 'default'"),
    ],
)
def test_the_query_names_the_queues_the_workers_serve(queues: str | None, listed: str) -> None:
    config = {} if queues is None else {"QUEUES": queues}
    query = query_of(render({**KEDA, "config": config}))
    assert f"queue IN ({listed})" in query


# ---- on a real table ---------------------------------------------------------------


@pytest.fixture(scope="module")
def filled(pg_server: str, pg_template: str) -> Iterator[str]:
    """URL of a migrated database holding ROWS jobs of bench.listing's mix, analysed."""
    name = pg.create_database(pg_server, pg_template)
    url = pg.with_database(pg_server, name)

    async def fill() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(FILL, ROWS, timeout=300)
            await conn.execute("VACUUM ANALYZE jobqueue.jobs", timeout=300)
        finally:
            await conn.close()

    try:
        asyncio.run(fill())
        yield url
    finally:
        pg.drop_database(pg_server, name)


async def test_the_query_counts_due_pending_jobs_of_the_served_queues_only(filled: str) -> None:
    query = query_of(render({**KEDA, "config": {"QUEUES": "default,critical:2"}}))
    conn = await asyncpg.connect(filled)
    try:
        rows = await conn.fetch("SELECT status, queue, run_at <= now() AS due FROM jobqueue.jobs")
        counted = await conn.fetchval(query)
    finally:
        await conn.close()
    expected = sum(
        1
        for r in rows
        if r["status"] == "pending" and r["due"] and r["queue"] in ("default", "critical")
    )
    # The mix holds what must not count: scheduled jobs, the bulk queue, running ones.
    assert any(r["status"] == "pending" and not r["due"] for r in rows)
    assert any(r["status"] == "pending" and r["queue"] == "bulk" for r in rows)
    assert counted == expected > 0


async def test_the_query_reads_the_claim_index_and_no_finished_row(filled: str) -> None:
    query = query_of(render({**KEDA, "config": {"QUEUES": "default,critical:2"}}))
    conn = await asyncpg.connect(filled)
    try:
        plan = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {query}")
    finally:
        await conn.close()
    reads = [n for n in _nodes(plan) if n.get("Relation Name") == "jobs" or "Index Name" in n]
    assert reads, plan
    for node in reads:
        assert node["Node Type"] in ("Index Scan", "Index Only Scan"), plan
        assert node["Index Name"] in {"jobs_claim_queue_idx", "jobs_claim_key_idx"}, plan
