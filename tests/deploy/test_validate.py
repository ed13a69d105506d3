"""scripts/validate_deploy.py rejects broken deployment files instead of passing them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.script import validate_deploy

LATEST = validate_deploy.KUBE_VERSIONS[-1]


def worker(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [
        d
        for d in validate_deploy.find(manifests, "Deployment")
        if d["metadata"]["name"].endswith("-worker")
    ]
    return copy.deepcopy(deployment)


def test_every_rendered_manifest_passes_strict_validation(
    default_manifests: list[dict[str, Any]], production_manifests: list[dict[str, Any]]
) -> None:
    for version in validate_deploy.KUBE_VERSIONS:
        for manifest in default_manifests + production_manifests:
            assert validate_deploy.manifest_problems(manifest, version) == []


def test_an_unknown_field_fails_strict_validation(default_manifests: list[dict[str, Any]]) -> None:
    deployment = worker(default_manifests)
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["path"] = "/healthz"
    (problem,) = validate_deploy.manifest_problems(deployment, LATEST)
    assert "livenessProbe" in problem and "'path' was unexpected" in problem


def test_a_wrongly_typed_field_fails_validation(default_manifests: list[dict[str, Any]]) -> None:
    deployment = worker(default_manifests)
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "35s"
    (problem,) = validate_deploy.manifest_problems(deployment, LATEST)
    assert "terminationGracePeriodSeconds" in problem


def test_a_malformed_service_monitor_fails_validation(
    production_manifests: list[dict[str, Any]],
) -> None:
    (monitor,) = copy.deepcopy(validate_deploy.find(production_manifests, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    monitor["spec"]["endpoints"][1]["targetPort"] = 9090
    problems = validate_deploy.manifest_problems(monitor, LATEST)
    assert len(problems) == 2


def test_every_ci_values_set_renders_valid_manifests() -> None:
    sets = validate_deploy.ci_values()
    assert {"ci/production-values.yaml", "ci/keda-values.yaml"} <= sets.keys()
    for values in sets.values():
        manifests = validate_deploy.render_chart(values)
        for version in validate_deploy.KUBE_VERSIONS:
            for manifest in manifests:
                assert validate_deploy.manifest_problems(manifest, version) == []


@pytest.fixture(scope="module")
def keda_manifests() -> list[dict[str, Any]]:
    return validate_deploy.render_chart(validate_deploy.ci_values()["ci/keda-values.yaml"])


def test_a_malformed_prometheus_rule_fails_validation(
    production_manifests: list[dict[str, Any]],
) -> None:
    (rule,) = copy.deepcopy(validate_deploy.find(production_manifests, "PrometheusRule"))
    first = rule["spec"]["groups"][0]["rules"][0]
    first["for"] = "5 minutes"
    first["severity"] = "critical"  # belongs under labels
    problems = validate_deploy.manifest_problems(rule, LATEST)
    assert len(problems) == 2


def test_a_malformed_scaled_object_fails_validation(
    keda_manifests: list[dict[str, Any]],
) -> None:
    (scaled,) = copy.deepcopy(validate_deploy.find(keda_manifests, "ScaledObject"))
    scaled["spec"]["triggers"][0]["metadata"]["targetQueryValue"] = 20  # KEDA wants strings
    scaled["spec"]["maxReplicas"] = 10  # maxReplicaCount
    problems = validate_deploy.manifest_problems(scaled, LATEST)
    assert len(problems) == 2


def test_a_trigger_authentication_without_a_key_fails_validation(
    keda_manifests: list[dict[str, Any]],
) -> None:
    (auth,) = copy.deepcopy(validate_deploy.find(keda_manifests, "TriggerAuthentication"))
    del auth["spec"]["secretTargetRef"][0]["key"]
    (problem,) = validate_deploy.manifest_problems(auth, LATEST)
    assert "'key' is a required property" in problem


def test_a_kind_without_a_schema_is_reported_not_passed() -> None:
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert validate_deploy.manifest_problems(widget, LATEST) != []


def test_hadolint_flags_a_shell_form_entrypoint(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM python:3.11-slim-bookworm\nUSER 10001\nENTRYPOINT jobqueue-api\n")
    findings = validate_deploy.hadolint_findings(dockerfile)
    assert any("DL3025" in line for line in findings)


def test_compose_config_rejects_an_unknown_key(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    text = validate_deploy.COMPOSE_FILE.read_text()
    assert "    stop_grace_period: 40s" in text
    broken.write_text(text.replace("    stop_grace_period: 40s", "    stop_grace_periode: 40s", 1))
    with pytest.raises(ValueError, match="stop_grace_periode"):
        validate_deploy.compose_config(compose_file=broken)


def test_compose_config_rejects_a_dependency_on_a_missing_service(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    text = validate_deploy.COMPOSE_FILE.read_text()
    dependency = "      migrate:\n        condition"
    assert dependency in text
    broken.write_text(text.replace(dependency, "      migration:\n        condition", 1))
    with pytest.raises(ValueError, match="migration"):
        validate_deploy.compose_config(compose_file=broken)
