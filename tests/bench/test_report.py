"""The benchmark's arithmetic: medians over repeats, ratios ours/peer, the backlog verdict."""

from __future__ import annotations

from typing import Any

import pytest

from bench.report import render, summarize
from bench.stats import percentile


def session(system: str, processes: int, drain: float, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "session",
        "system": system,
        "processes": processes,
        "workers": 50 if system == "jobqueue" else None,
        "drain_jobs_per_s": drain,
        "bulk_enqueue_jobs_per_s": 10_000.0,
        **extra,
    }


def pickup(p50: float) -> dict[str, Any]:
    figures = {"p50_ms": p50, "p95_ms": p50 * 2, "p99_ms": p50 * 3}
    return {"pickup": {"from_commit": figures, "from_call": figures}}


def backlog_row(table: str, claim_p50: float, claim_p99: float, drain: float) -> dict[str, Any]:
    return {
        "kind": "backlog",
        "table": table,
        "claim": {"p50_ms": claim_p50, "p99_ms": claim_p99},
        "drain_jobs_per_s": drain,
    }


CONFIG = {
    "workers": 50,
    "jobs": 1000,
    "repeat": 3,
    "batch_concurrency": 4,
    "backlog_completed": 1_000_000,
    "backlog_pending": 200_000,
    "claim_n": 10,
    "backlog_window": 20_000,
}


def document(results: list[dict[str, Any]]) -> dict[str, Any]:
    doc = {
        "config": CONFIG,
        "results": results,
        "errors": [],
        "systems": {},
        "machine": {"cpus": 2, "postgresql": "15"},
    }
    doc["summary"] = summarize(doc)
    return doc


def test_percentile_interpolates_between_closest_ranks() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 99) == 5
    assert percentile([0, 10], 99) == pytest.approx(9.9)


def test_figures_are_medians_over_repeats_and_ratios_are_ours_over_peer() -> None:
    doc = document(
        [
            session("jobqueue", 2, 9000, **pickup(1.0)),
            session("jobqueue", 2, 10_000, **pickup(2.0)),
            session("jobqueue", 2, 50_000, **pickup(9.0)),
            session("pgqueuer", 2, 4000, **pickup(4.0)),
            session("pgqueuer", 2, 5000, **pickup(4.0)),
            session("pgqueuer", 2, 6000, **pickup(4.0)),
        ]
    )
    summary = doc["summary"]
    assert summary["systems"]["jobqueue"]["drain_2proc_jobs_per_s"] == 10_000
    assert summary["systems"]["jobqueue"]["pickup_from_commit_p50_ms"] == 2.0
    assert summary["ratios"]["pgqueuer"]["drain_2proc"] == 2.0
    assert summary["ratios"]["pgqueuer"]["pickup_from_commit_p50"] == 0.5
    (target,) = [t for t in summary["targets"] if "PgQueuer" in t["target"]]
    assert target["met"] is True
    assert "ratio jobqueue/pgqueuer" in render(doc)


def test_backlog_counts_only_slowdowns_against_the_20_percent_bound() -> None:
    faster = document(
        [backlog_row("empty", 1.0, 2.0, 1000), backlog_row("backlog", 0.5, 1.0, 2000)]
    )
    assert faster["summary"]["backlog"]["within_20pct"] is True

    slower_drain = document(
        [backlog_row("empty", 1.0, 2.0, 1000), backlog_row("backlog", 1.0, 2.0, 790)]
    )
    backlog = slower_drain["summary"]["backlog"]
    assert backlog["difference_pct"]["drain_jobs_per_s"] == pytest.approx(-21)
    assert backlog["within_20pct"] is False

    slower_claims = document(
        [backlog_row("empty", 1.0, 2.0, 1000), backlog_row("backlog", 1.25, 2.0, 1000)]
    )
    assert slower_claims["summary"]["backlog"]["within_20pct"] is False
