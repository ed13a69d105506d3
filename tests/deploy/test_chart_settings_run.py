"""The real services under the chart's default settings: they start, answer the
chart's probes, and stop within the grace period the chart gives them."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deploy.script import validate_deploy
from tests.procs import Service, free_port, wait_for

pytestmark = pytest.mark.e2e


def status(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0


def chart_env(manifests: list[dict[str, Any]]) -> dict[str, str]:
    (config_map,) = validate_deploy.find(manifests, "ConfigMap")
    return dict(config_map["data"])


def probe_paths_and_grace(manifests: list[dict[str, Any]], suffix: str) -> tuple[str, str, int]:
    (deployment,) = [
        d
        for d in validate_deploy.find(manifests, "Deployment")
        if d["metadata"]["name"].endswith(suffix)
    ]
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return (
        container["livenessProbe"]["httpGet"]["path"],
        container["readinessProbe"]["httpGet"]["path"],
        spec["terminationGracePeriodSeconds"],
    )


@pytest.mark.parametrize(
    ("command", "suffix", "listen_variable"),
    [("jobqueue-api", "-api", "HTTP_ADDR"), ("jobqueue-worker", "-worker", "METRICS_ADDR")],
)
def test_service_answers_the_charts_probes_and_stops_within_its_grace_period(
    command: str,
    suffix: str,
    listen_variable: str,
    database_url: str,
    default_manifests: list[dict[str, Any]],
    tmp_path: Path,
) -> None:
    liveness, readiness, grace = probe_paths_and_grace(default_manifests, suffix)
    port = free_port()  # the chart's port may be taken by a parallel test; the path is the point
    env = chart_env(default_manifests) | {
        "DATABASE_URL": database_url,
        listen_variable: f"127.0.0.1:{port}",
    }
    if command == "jobqueue-worker":
        metrics_dir = tmp_path / "prometheus"  # the pod's emptyDir
        metrics_dir.mkdir()
        env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    service = Service(command, env)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: status(base + liveness) == 200, 60, f"{command} {liveness}")
        wait_for(lambda: status(base + readiness) == 200, 60, f"{command} {readiness}")

        started = time.monotonic()
        service.signal(signal.SIGTERM)
        # Readiness fails first, so the Service stops routing before the process exits.
        wait_for(
            lambda: service.proc.poll() is not None or status(base + readiness) != 200,
            10,
            f"{command} {readiness} to fail after SIGTERM",
        )
        code = service.wait(timeout=grace + 30)
        elapsed = time.monotonic() - started
    finally:
        if service.proc.poll() is None:
            service.kill()
    assert code == 0, service.output()
    assert elapsed < grace, f"{command} took {elapsed:.1f}s; the chart allows {grace}s"
