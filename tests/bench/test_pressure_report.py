"""`make bench-pressure`'s arithmetic: per-second completions, phase figures, ratios to the
clean phase, the dead-tuple recovery time, the table, and the command line."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from bench.pressure import QUICK, SCENARIOS, Config, parse_args
from bench.pressure_load import JOBS, TABLES, qualified
from bench.pressure_report import (
    PHASES,
    first_vacuum_after,
    per_second,
    phase_figures,
    phase_of,
    ratios,
    recovered_after,
    render,
)
from jobcore import schema


def test_a_second_without_completions_counts_zero_and_the_partial_last_second_is_left_out() -> None:
    assert per_second({0: 5, 2: 7, 3: 9}, 3.6) == [5, 0, 7]
    assert per_second({}, 2.0) == [0, 0]


def test_a_time_belongs_to_the_phase_whose_half_open_interval_holds_it() -> None:
    bounds = {"clean": (10.0, 20.0), "pressure": (20.0, 30.0)}
    assert phase_of(10.0, bounds) == "clean"
    assert phase_of(20.0, bounds) == "pressure"
    assert phase_of(9.9, bounds) is None and phase_of(30.0, bounds) is None


def figures(**overrides: Any) -> dict[str, Any]:
    given: dict[str, Any] = {
        "seconds": 4.0,
        "completions": {0: 100, 1: 0, 2: 300, 3: 200},
        "target_rate": 200.0,
        "offered": 800,
        "accepted": 790,
        "latencies": [0.010, 0.020, 0.030],
        "requests": [0.004, 0.006],
        "backlog": [5, 40, 10],
        "backlog_end": 2,
        "relations": [{"name": "jobs", "kind": "table", "n_dead_tup": 3, "bytes": 8192}],
    }
    return phase_figures(**(given | overrides))


def test_phase_figures_take_the_median_second_the_rates_and_the_claim_percentiles() -> None:
    f = figures()
    assert f["completed"] == 600
    assert f["completed_per_s_median"] == 150.0  # zero seconds weigh in
    assert f["completed_per_s_min"] == 0
    assert (f["offered_per_s"], f["accepted_per_s"]) == (200.0, 197.5)
    assert f["claim_p50_ms"] == pytest.approx(20.0)
    assert f["claim_p99_ms"] == pytest.approx(29.8)
    assert f["claim_samples"] == 3
    assert f["batch_p99_ms"] == pytest.approx(5.98)
    assert (f["backlog_max"], f["backlog_end"]) == (40, 2)


def test_a_phase_without_samples_has_no_claim_latency_and_its_end_count_is_its_backlog() -> None:
    f = figures(latencies=[], requests=[], backlog=[], backlog_end=7)
    assert f["claim_p50_ms"] is None and f["claim_p99_ms"] is None and f["claim_samples"] == 0
    assert f["batch_p99_ms"] is None
    assert f["backlog_max"] == 7


def test_ratios_set_pressure_and_recovery_against_clean() -> None:
    phases = {
        "clean": {"completed_per_s_median": 800.0, "claim_p99_ms": 10.0},
        "pressure": {"completed_per_s_median": 200.0, "claim_p99_ms": 5000.0},
        "recovery": {"completed_per_s_median": 1200.0, "claim_p99_ms": 20.0},
    }
    assert ratios(phases) == {
        "completion_pressure_over_clean": 0.25,
        "claim_p99_pressure_over_clean": 500.0,
        "completion_recovery_over_clean": 1.5,
        "claim_p99_recovery_over_clean": 2.0,
    }


def test_a_ratio_without_a_clean_figure_is_none_rather_than_infinite() -> None:
    phases = {
        "clean": {"completed_per_s_median": 0.0, "claim_p99_ms": None},
        "pressure": {"completed_per_s_median": 10.0, "claim_p99_ms": 5.0},
    }
    assert set(ratios(phases).values()) == {None}


def test_dead_tuples_recover_at_the_first_sample_under_the_threshold_after_the_release() -> None:
    samples = [(99.0, 5), (101.0, 90_000), (104.0, 12_000), (107.0, 9_999), (110.0, 100)]
    assert recovered_after(samples, 100.0) == 7.0
    assert recovered_after(samples, 100.0, threshold=50) is None
    assert recovered_after([], 100.0) is None


def test_the_first_vacuum_after_the_release_is_the_first_sample_counting_one_more() -> None:
    samples = [(98.0, 1), (99.0, 2), (101.0, 2), (103.0, 2), (105.0, 3), (107.0, 4)]
    assert first_vacuum_after(samples, 100.0) == 5.0
    assert first_vacuum_after(samples[:4], 100.0) is None
    assert first_vacuum_after(samples[2:], 100.0) is None  # nothing to compare with


def document() -> dict[str, Any]:
    relations = [
        {"name": "jobs", "kind": "table", "n_dead_tup": 12_345, "bytes": 2**20},
        {"name": "jobs_pkey", "kind": "index", "n_dead_tup": None, "bytes": 2**19},
    ]
    phases = {p: figures(relations=relations) for p in PHASES}
    scenario = {
        "jobs_relation": "jobs",
        "phases": phases,
        "ratios": ratios(phases),
        "dead_tuples_recovered_s": None,
        "first_vacuum_after_release_s": 41.0,
        "holder": {"sessions": 1, "xid": 42},
    }
    config = Config(clean=4, pressure=4, recovery=4)
    return {
        "config": vars(config),
        "vacuum": "autovacuum",
        "jobs_table": "jobs",
        "scenarios": {"idle-xid": scenario, "rate-1.5x": scenario | {"holder": {}}},
        "errors": [{"scenario": "repeatable-read", "error": "RuntimeError('boom')"}],
    }


def test_the_table_has_a_row_per_scenario_and_phase_and_says_what_did_not_recover() -> None:
    text = render(document())
    rows = [
        line.split()[:2]
        for line in text.splitlines()
        if line.split()[:1] in (["idle-xid"], ["rate-1.5x"])
    ]
    for name in ("idle-xid", "rate-1.5x"):
        for phase in PHASES:
            assert [name, phase] in rows
    assert (
        "idle-xid: jobs dead tuples under 10,000: not within the phase; the first vacuum after"
        " the release had finished 41 s after it" in text
    )
    assert "idle-xid: horizon holder: sessions 1, xid 42" in text
    assert "rate-1.5x: horizon holder" not in text
    assert "12,345 / 1.00 MB" in text and "0.50 MB" in text
    assert "repeatable-read: FAILED: RuntimeError('boom')" in text


def test_quick_shortens_every_phase_and_options_override_it() -> None:
    quick = parse_args(["--quick", "--server", "postgresql://x/postgres"])
    assert (quick.rate, quick.clean, quick.pressure, quick.recovery) == tuple(QUICK.values())
    assert quick.scenarios == list(SCENARIOS)
    chosen = parse_args(
        ["--quick", "--scenario", "idle-xid", "--rate", "50", "--pressure", "5", "--server", "u"]
    )
    assert chosen.scenarios == ["idle-xid"] and chosen.rate == 50 and chosen.pressure == 5
    assert chosen.rate_in("idle-xid", "pressure") == 50
    assert Config(rate=100).rate_in("rate-1.5x", "pressure") == 150
    assert Config(rate=100).rate_in("rate-1.5x", "recovery") == 100
    with pytest.raises(SystemExit):
        parse_args(["--clean", "1", "--server", "u"])


def test_a_table_is_named_with_its_schema_once_it_has_one() -> None:
    assert qualified(schema.jobs) == JOBS == "jobqueue.jobs"
    assert qualified(sa.Table("jobs", sa.MetaData(), schema="Queue")) == '"Queue".jobs'
    assert sorted(TABLES) == sorted(qualified(t) for t in schema.metadata.tables.values())
