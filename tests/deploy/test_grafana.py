"""deploy/grafana/jobqueue.json: a dashboard whose every query selects metrics the real
services export, aggregated as docs/operations.md says."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy import live, promql
from tests.deploy.script import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "jobqueue.json"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included; rows themselves left out."""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def panel_expressions(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression: panel queries and the query variables'."""
    found = panel_expressions(dashboard)
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            # label_values(metric, label): the metric is an expression of its own.
            found.append(text.removeprefix("label_values(").rsplit(",", 1)[0])
    return found


def used_metrics(exprs: list[str]) -> set[str]:
    return {name for expr in exprs for name in promql.metric_names(expr)}


# ---- the tokenizer ------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("jobs_completed_total", {"jobs_completed_total"}),
        (
            'sum by (status, queue) (rate(jobs_failed_total{status="dead_letter"}[5m]))',
            {"jobs_failed_total"},
        ),
        ("sum(rate(x_total[$__rate_interval])) by (le)", {"x_total"}),
        ('max without (instance) (a{queue=~"$queue", le="+Inf"} offset 1h30m)', {"a"}),
        ("a / on (queue) group_left (status) b", {"a", "b"}),
        ("a / ignoring(pod) group_right b > bool 0.5e3", {"a", "b"}),
        ("histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m:30s])))", {"h_bucket"}),
        ('label_replace(up, "by", "$1", "on", "(.*)") and absent(w)', {"up", "w"}),
        ("time() - max(t_seconds) > 3600 or vector(0) unless Inf < NaN", {"t_seconds"}),
        ("a:recorded:rate5m @ start() + ${datasource_thing}", {"a:recorded:rate5m"}),
        ("count(sum by (queue) (x)) == 0x1F", {"x"}),
    ],
)
def test_the_tokenizer_finds_metric_names_and_nothing_else(expr: str, names: set[str]) -> None:
    assert promql.metric_names(expr) == names


def test_the_tokenizer_names_the_calls_around_each_selection() -> None:
    expr = "sum(max by (queue) (rate(q[5m]))) / max(q) + avg(x) + (q)"
    assert promql.enclosing_calls(expr, "q") == [["rate", "max", "sum"], ["max"], []]
    assert promql.innermost_aggregation(["rate", "max", "sum"]) == "max"
    assert promql.enclosing_calls("max(q) by (queue)", "q") == [["max"]]


# ---- the dashboard ------------------------------------------------------------


def test_every_panel_queries_the_chosen_prometheus_data_source() -> None:
    dashboard = load()
    assert dashboard["schemaVersion"] == 39
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["queue"]["definition"] == "label_values(jobs_queued, queue)"
    assert "__inputs" not in dashboard, "a dashboard for provisioning, not for import"
    for panel in panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    dashboard = load()
    everything = list(dashboard["panels"])
    ids = [p["id"] for p in everything]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in everything:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24
        mine = {
            (x, y)
            for x in range(box["x"], box["x"] + box["w"])
            for y in range(box["y"], box["y"] + box["h"])
        }
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine


def test_the_dashboard_covers_throughput_depth_latency_workers_and_retention() -> None:
    used = used_metrics(expressions(load()))
    assert used >= {
        "jobs_submitted_total",
        "jobs_completed_total",
        "jobs_failed_total",
        "jobs_retried_total",
        "jobs_cancelled_total",
        "jobs_lease_lost_total",
        "jobs_queued",
        "jobs_oldest_pending_age_seconds",
        "job_processing_duration_seconds_bucket",
        "http_request_duration_seconds_count",
        "http_request_duration_seconds_bucket",
        "jobs_rejected_total",
        "worker_processes",
        "jobs_pruned_total",
        "jobs_retention_last_run_timestamp_seconds",
    }


def test_gauges_of_one_leader_are_aggregated_with_max_never_sum() -> None:
    exprs = panel_expressions(load())
    assert used_metrics(exprs) >= live.MAX_AGGREGATED
    for expr in exprs:
        for metric in live.MAX_AGGREGATED:
            for calls in promql.enclosing_calls(expr, metric):
                assert promql.innermost_aggregation(calls) == "max", expr


def test_counters_and_histograms_are_read_as_rates() -> None:
    for expr in panel_expressions(load()):
        for metric in promql.metric_names(expr):
            if metric.endswith(("_total", "_bucket")):
                for calls in promql.enclosing_calls(expr, metric):
                    assert calls and calls[0] == "rate", f"{metric} in {expr}"


@pytest.mark.e2e
@pytest.mark.xdist_group("live_metrics")
def test_every_metric_the_dashboard_queries_is_exported_by_a_real_service(
    live_scrape: live.Scrape,
) -> None:
    exported: dict[str, str] = {}
    for page in live_scrape.pages().values():
        exported |= live.exposed(page)
    used = used_metrics(expressions(load()))
    missing = used - exported.keys()
    assert not missing, f"not exported by jobqueue-api or jobqueue-worker: {sorted(missing)}"
    # A histogram is queried through its _bucket, _sum and _count series, and those
    # suffixes mean a histogram's series (not a counter or gauge named so).
    for name in used:
        is_histogram = exported[name] == "histogram"
        assert is_histogram == name.endswith(HISTOGRAM_SUFFIXES), name
