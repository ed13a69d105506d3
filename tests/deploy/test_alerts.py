"""deploy/prometheus/alerts.yaml: rules promtool accepts, unit-tested firing and not firing,
over metrics the real services export (which promtool's linter accepts too)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import live, promql
from tests.deploy.script import ROOT

RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts.test.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"
SEVERITIES = {"critical", "warning"}


def promtool() -> str:
    """promtool's path; its absence fails the test (CI installs it)."""
    found = shutil.which("promtool")
    assert found, "promtool is missing: run `bash scripts/install-test-tools.sh`"
    return found


def run_promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], input=stdin, capture_output=True, text=True, timeout=120
    )


def alerts(path: Path = RULES) -> list[dict[str, Any]]:
    (group,) = yaml.safe_load(path.read_text())["groups"]
    assert group["name"] == "jobqueue"
    rules: list[dict[str, Any]] = group["rules"]
    return rules


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings of a markdown page."""
    found = set()
    for heading in re.findall(r"^#+ +(.+?) *$", markdown, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_promtool_accepts_the_rules() -> None:
    checked = run_promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in checked.stdout


def test_the_unit_tests_of_every_alert_pass() -> None:
    tested = run_promtool("test", "rules", str(RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_the_unit_tests_fail_when_an_alert_changes(tmp_path: Path) -> None:
    # The same tests against rules whose API alert no longer leaves the probes out.
    changed = RULES.read_text().replace(', route!~"/healthz|/readyz|/metrics"', "")
    assert changed != RULES.read_text()
    (tmp_path / "alerts.yaml").write_text(changed)
    shutil.copy(RULE_TESTS, tmp_path / "alerts.test.yaml")
    tested = run_promtool("test", "rules", str(tmp_path / "alerts.test.yaml"))
    assert tested.returncode != 0
    assert "unready probes and client errors do not fire" in tested.stdout + tested.stderr


def test_every_alert_is_tested_both_firing_and_not_firing() -> None:
    spec = yaml.safe_load(RULE_TESTS.read_text())
    assert spec["rule_files"] == ["alerts.yaml"]
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in spec["tests"]:
        for check in case["alert_rule_test"]:
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert fired == names
    assert quiet == names


def test_every_alert_waits_has_a_severity_and_points_to_its_runbook() -> None:
    sections = anchors(OPERATIONS.read_text())
    rules = alerts()
    assert {r["alert"] for r in rules} == {
        "JobqueueOldestPendingJobTooOld",
        "JobqueueDeadLettersGrowing",
        "JobqueueNoWorkerRunning",
        "JobqueueApiErrors",
        "JobqueueLeaseLosses",
        "JobqueueRetentionStalled",
    }
    for rule in rules:
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"]
        page, _, anchor = notes["runbook_url"].partition("#")
        assert page == "docs/operations.md"
        assert anchor == rule["alert"].lower() and anchor in sections, rule["alert"]


def test_gauges_of_one_leader_are_aggregated_with_max() -> None:
    for rule in alerts():
        for metric in live.MAX_AGGREGATED:
            for calls in promql.enclosing_calls(rule["expr"], metric):
                assert promql.innermost_aggregation(calls) == "max", rule["alert"]


@pytest.mark.e2e
@pytest.mark.xdist_group("live_metrics")
def test_every_metric_the_alerts_select_is_exported_by_a_real_service(
    live_scrape: live.Scrape,
) -> None:
    exported: set[str] = set()
    for page in live_scrape.pages().values():
        exported |= live.exposed(page).keys()
    for rule in alerts():
        missing = promql.metric_names(rule["expr"]) - exported
        assert not missing, f"{rule['alert']} selects what no service exports: {missing}"


@pytest.mark.e2e
@pytest.mark.xdist_group("live_metrics")
@pytest.mark.parametrize("service", ["jobqueue-api", "jobqueue-worker"])
def test_promtool_finds_no_problem_in_the_metrics_a_service_serves(
    service: str, live_scrape: live.Scrape
) -> None:
    page = live_scrape.pages()[service]
    checked = run_promtool("check", "metrics", stdin=page)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert (checked.stdout + checked.stderr).strip() == ""
