"""The chart's monitoring options: the alert rules as a PrometheusRule and the dashboard as a
ConfigMap for Grafana's sidecar, both from the files under deploy/ (the chart's copies are
held equal to them)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.script import ROOT, validate_deploy
from tests.deploy.test_chart import only

Manifest = dict[str, Any]
render = validate_deploy.render_chart
find = validate_deploy.find
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "jobqueue.json"


def test_no_rules_and_no_dashboard_by_default(default_manifests: list[Manifest]) -> None:
    assert find(default_manifests, "PrometheusRule") == []
    assert [m["metadata"]["name"] for m in find(default_manifests, "ConfigMap")] == ["jobqueue"]


def test_the_chart_copies_equal_the_files_under_deploy() -> None:
    assert validate_deploy.copy_problems() == []


def test_a_stale_copy_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "alerts.yaml"
    stale.write_text(ALERTS.read_text().replace("> 300", "> 600"))
    monkeypatch.setattr(validate_deploy, "CHART_COPIES", {stale: ALERTS})
    monkeypatch.setattr(validate_deploy, "ROOT", Path("/"))
    (problem,) = validate_deploy.copy_problems()
    assert "alerts.yaml differs from" in problem and "cp " in problem


def test_the_prometheus_rule_holds_the_alert_rules_file() -> None:
    manifests = render({"prometheusRule": {"enabled": True, "labels": {"release": "prom"}}})
    rule = only(manifests, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def test_runbook_links_take_the_configured_base() -> None:
    base = "https://git.example.com/jobqueue/blob/main/"
    manifests = render({"prometheusRule": {"enabled": True, "runbookBaseUrl": base}})
    expected = copy.deepcopy(yaml.safe_load(ALERTS.read_text())["groups"])
    for group in expected:
        for rule in group["rules"]:
            rule["annotations"]["runbook_url"] = base + rule["annotations"]["runbook_url"]
    assert only(manifests, "PrometheusRule")["spec"]["groups"] == expected
    assert expected[0]["rules"][0]["annotations"]["runbook_url"].startswith(
        base + "docs/operations.md#"
    )


def test_the_dashboard_config_map_carries_the_sidecar_label_and_the_dashboard() -> None:
    manifests = render(
        {"grafana": {"dashboard": {"enabled": True, "annotations": {"grafana_folder": "jobqueue"}}}}
    )
    board = only(manifests, "ConfigMap", "-dashboard")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["metadata"]["annotations"] == {"grafana_folder": "jobqueue"}
    (key,) = board["data"]
    assert key.endswith(".json")
    assert json.loads(board["data"][key]) == json.loads(DASHBOARD.read_text())


def test_the_sidecar_label_can_be_changed() -> None:
    # Helm merges maps with the defaults: null takes the default label away.
    labels = {"grafana_dashboard": None, "dashboards": "jobqueue"}
    manifests = render({"grafana": {"dashboard": {"enabled": True, "labels": labels}}})
    labels = only(manifests, "ConfigMap", "-dashboard")["metadata"]["labels"]
    assert labels["dashboards"] == "jobqueue" and "grafana_dashboard" not in labels


def test_production_values_render_rules_and_dashboard(
    production_manifests: list[Manifest],
) -> None:
    rule = only(production_manifests, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    only(production_manifests, "ConfigMap", "-dashboard")
