"""The benchmark's arithmetic: medians over repeats, ratios ours/peer, the backlog verdict."""

from __future__ import annotations

import os
from typing import Any

import pytest

from bench import features
from bench.queues import parse_args, total_steps
from bench.report import EXPECTED, render, summarize
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


def target_line(text: str, name: str) -> list[str]:
    """The cells of the Targets table's line for the target `name` (verdict first)."""
    table = text.split("\nTargets\n", 1)[1].splitlines()
    (line,) = [line for line in table if f"  {name}  " in line]
    verdict, rest = line.strip().split("  ", 1)
    return [verdict, *(cell.strip() for cell in rest.split("  ") if cell.strip())]


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
    (target,) = [t for t in summary["targets"] if t["target"].startswith("drain 2 procs vs PgQ")]
    assert (target["measured"], target["versus"], target["ratio"]) == (10_000, 5_000, 2.0)
    assert (target["met"], target["status"]) == (True, "met")
    text = render(doc)
    assert "ratio jobqueue/pgqueuer" in text
    assert target_line(text, "drain 2 procs vs PgQueuer (jobs/s)") == [
        "met",
        "drain 2 procs vs PgQueuer (jobs/s)",
        ">= 2x",
        "10,000 vs 5,000",
        "2.00x",
    ]


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


def lateness_row(poll: str, p99: float, earliest: float, early: int = 0) -> dict[str, Any]:
    return {
        "kind": "lateness",
        "poll_interval": poll,
        "processes": 2,
        "workers": 50,
        "p50_ms": p99 / 4,
        "p95_ms": p99 / 2,
        "p99_ms": p99,
        "earliest_ms": earliest,
        "early": early,
        "samples": 400,
    }


def two_queue_row(drain: float) -> dict[str, Any]:
    return {
        "kind": "two_queues",
        "processes": 2,
        "workers": 50,
        "queues": "a,b",
        "drain_jobs_per_s": drain,
    }


def verdicts(doc: dict[str, Any]) -> dict[str, bool]:
    return {t["target"]: t["met"] for t in doc["summary"]["targets"]}


def test_scheduled_lateness_meets_its_target_only_if_p99_within_250ms_and_never_early() -> None:
    doc = document(
        [
            lateness_row("1s", 12.0, 2.0),
            lateness_row("1s", 300.0, 1.0),
            lateness_row("1s", 20.0, 3.0),
            lateness_row("5s", 260.0, 4.0),
            lateness_row("5s", 270.0, -0.4, early=1),
            lateness_row("5s", 10.0, 5.0),
        ]
    )
    late = doc["summary"]["scheduling"]["lateness"]
    assert late["1s"]["p99_ms"] == 20.0  # the median over repeats
    assert late["5s"]["earliest_ms"] == -0.4  # the earliest start of every repeat
    assert late["5s"]["early"] == 1
    met = verdicts(doc)
    assert met["scheduled-job lateness p99, POLL_INTERVAL=1s (ms)"] is True
    assert met["scheduled-job lateness p99, POLL_INTERVAL=5s (ms)"] is False
    assert met["scheduled jobs never start early, POLL_INTERVAL=1s (earliest lateness, ms)"]
    assert not met["scheduled jobs never start early, POLL_INTERVAL=5s (earliest lateness, ms)"]
    text = render(doc)
    assert "Scheduled jobs: lateness after run_at" in text
    assert target_line(text, "scheduled-job lateness p99, POLL_INTERVAL=5s (ms)") == [
        "MISSED",
        "scheduled-job lateness p99, POLL_INTERVAL=5s (ms)",
        "<= 250",
        "260.00",
    ]


def test_two_queue_drain_is_set_against_the_single_queue_drain_of_the_same_run() -> None:
    doc = document(
        [
            session("jobqueue", 2, 10_000),
            session("jobqueue", 1, 6_000),
            two_queue_row(9_100),
        ]
    )
    two = doc["summary"]["scheduling"]["two_queues"]
    assert two["single_queue_jobs_per_s"] == 10_000  # the 2-process drain, not the 1-process
    assert two["ratio"] == pytest.approx(0.91)
    assert verdicts(doc)["drain over two queues, mixed priorities, vs one queue (ratio)"] is True
    assert "drain 9,100 jobs/s vs one queue 10,000 jobs/s: 0.91x" in render(doc)

    slower = document([session("jobqueue", 2, 10_000), two_queue_row(8_900)])
    assert (
        verdicts(slower)["drain over two queues, mixed priorities, vs one queue (ratio)"] is False
    )


def heartbeat_row(variant: str, drain: float, lost: int = 0) -> dict[str, Any]:
    return {
        "kind": "heartbeats",
        "variant": variant,
        "lease_duration": "3s" if variant == "renewing" else "48h",
        "processes": 2,
        "workers": 50,
        "drain_jobs_per_s": drain,
        "leases_lost": lost,
        "worker_cpu_us_per_job": 52.0 if variant == "renewing" else 50.0,
    }


def limits_row(variant: str, drain: float) -> dict[str, Any]:
    return {
        "kind": "type_limits",
        "variant": variant,
        "processes": 2,
        "workers": 50,
        "drain_jobs_per_s": drain,
        "limited_finished_s": 1.5,
        "worker_cpu_us_per_job": 60.0 if variant == "limited" else 50.0,
        "others_finished_s": 1.25,
    }


HEARTBEATS = (
    "drain with heartbeats renewing (LEASE_DURATION=3s) vs none due (48h), no lease lost (ratio)"
)
LIMITS = "drain with 10% of the jobs of a type under TYPE_CONCURRENCY vs no limits (ratio)"


def test_heartbeat_cost_is_renewing_over_idle_medians_and_a_lost_lease_misses_the_target() -> None:
    doc = document(
        [
            heartbeat_row("renewing", 1_900),
            heartbeat_row("idle", 2_000),
            heartbeat_row("renewing", 1_000),
            heartbeat_row("idle", 1_950),
            heartbeat_row("renewing", 1_960),
            heartbeat_row("idle", 3_000),
        ]
    )
    beats = doc["summary"]["costs"]["heartbeats"]
    assert (beats["jobs_per_s"], beats["without_jobs_per_s"]) == (1_900, 2_000)
    assert beats["ratio"] == pytest.approx(0.95)
    assert beats["leases_lost"] == 0
    assert verdicts(doc)[HEARTBEATS] is True
    text = render(doc)
    assert "Cost of heartbeats and per-type limits (2 process(es), WORKERS=50" in text
    assert (
        "heartbeats, jobs of 50 ms: LEASE_DURATION=3s 1,900 jobs/s vs 48h 2,000 jobs/s: 0.95x"
        " (0 lease(s) lost)"
    ) in text
    assert "    worker CPU per job 52 µs vs 50 µs" in text
    assert target_line(text, HEARTBEATS) == ["met", HEARTBEATS, ">= 0.95", "0.95x"]

    slower = document([heartbeat_row("renewing", 1_880), heartbeat_row("idle", 2_000)])
    assert verdicts(slower)[HEARTBEATS] is False
    lost = document([heartbeat_row("renewing", 2_000, lost=1), heartbeat_row("idle", 2_000)])
    assert verdicts(lost)[HEARTBEATS] is False
    assert "(1 lease(s) lost)" in render(lost)


def test_type_limit_cost_is_the_limited_drain_over_the_unlimited_one_of_the_same_run() -> None:
    doc = document([limits_row("limited", 8_100), limits_row("unlimited", 10_000)])
    limits = doc["summary"]["costs"]["type_limits"]
    assert limits["ratio"] == pytest.approx(0.81)
    assert limits["type_concurrency"] == "bench-limited:20"
    assert verdicts(doc)[LIMITS] is True
    assert (
        "10% of the jobs limited, TYPE_CONCURRENCY=bench-limited:20: 8,100 jobs/s vs no limits"
        " 10,000 jobs/s: 0.81x (limited type done after 1.50 s, the others after 1.25 s)"
    ) in render(doc)
    assert "    worker CPU per job 60 µs vs 50 µs" in render(doc)

    slower = document([limits_row("limited", 7_900), limits_row("unlimited", 10_000)])
    assert verdicts(slower)[LIMITS] is False
    assert target_line(render(slower), LIMITS) == ["MISSED", LIMITS, ">= 0.80", "0.79x"]
    # Half a pair has nothing to be set against: no figure, no target.
    alone = document([limits_row("limited", 7_900)])
    assert "costs" not in alone["summary"]
    assert LIMITS not in verdicts(alone)


def test_no_costs_flag_skips_the_four_cost_drains_of_each_repeat() -> None:
    config = parse_args(["--quick", "--server", "postgresql://unused"])
    skipped = parse_args(["--quick", "--no-costs", "--server", "postgresql://unused"])
    assert (config.costs, skipped.costs) == (True, False)
    assert total_steps(config) - total_steps(skipped) == 4 * config.repeat


def featured(drain: float, rep: int = 0, **more: Any) -> dict[str, Any]:
    return {
        "kind": "session",
        "system": features.SYSTEM,
        "repeat": rep,
        "processes": 2,
        "workers": 50,
        "jobs": 20_000,
        "drain_jobs_per_s": drain,
        "drain_seconds": 20_000 / drain,
        "bulk_enqueue_jobs_per_s": 40_000.0,
        "worker_cpu_us_per_job": 30.0,
        "prefill": 100_000,
        "pruned_before_drain": 5_000,
        "pruned_during_drain": 10_000,
        "prefill_left_after_drain": 80_000,
        "leases_lost": 0,
        "database_outages": 0,
        **more,
    }


FEATURED_PGQ = "drain 2 procs with the features on vs PgQueuer (jobs/s)"
FEATURED_PROC = "drain 2 procs with the features on vs Procrastinate (jobs/s)"


def test_the_drain_with_the_features_on_is_set_against_ours_and_the_peers_of_its_run() -> None:
    doc = document(
        [
            session("jobqueue", 2, 30_000, worker_cpu_us_per_job=20.0),
            session("jobqueue", 1, 18_000, worker_cpu_us_per_job=19.0),
            session("pgqueuer", 2, 9_000),
            session("procrastinate", 2, 1_000),
            featured(20_000),
            featured(24_000, rep=1),
            featured(10_000, rep=2),
        ]
    )
    section = doc["summary"]["features"]
    assert section["jobs_per_s"] == 20_000  # the median of the repeats
    assert section["versus"]["jobqueue"] == {"jobs_per_s": 30_000, "ratio": pytest.approx(2 / 3)}
    assert section["versus"]["pgqueuer"]["ratio"] == pytest.approx(20 / 9)
    assert section["versus"]["procrastinate"]["ratio"] == 20.0
    # Set against our 2-process drain, not the 1-process one.
    assert (section["worker_cpu_us_per_job"], section["plain_worker_cpu_us_per_job"]) == (30, 20)
    assert section["pruning_throughout"] and section["leases_lost"] == 0
    # Not a peer of ours: no ratio row of its own, but a row in the systems' table.
    assert features.SYSTEM not in doc["summary"]["ratios"]
    assert doc["summary"]["systems"][features.SYSTEM]["drain_2proc_jobs_per_s"] == 20_000
    met = verdicts(doc)
    assert met[FEATURED_PGQ] is True and met[FEATURED_PROC] is True
    text = render(doc)
    assert f"{features.SYSTEM}: drain of 20,000 no-op jobs, 2 process(es), WORKERS=50" in text
    assert "  20,000 jobs/s (repeats 20,000 / 24,000 / 10,000); 10,000 rows pruned" in text
    assert "  vs our plain drain: 30,000 jobs/s, 0.67x" in text
    assert "  vs PgQueuer: 9,000 jobs/s, 2.22x" in text
    assert "  worker CPU per job 30 µs vs 20 µs in our plain drain" in text
    assert target_line(text, FEATURED_PGQ) == [
        "met",
        FEATURED_PGQ,
        ">= 2x",
        "20,000 vs 9,000",
        "2.22x",
    ]

    slow = document([session("pgqueuer", 2, 9_000), featured(17_000)])
    assert verdicts(slow)[FEATURED_PGQ] is False
    # A lost lease, a drain retention did not run through, an outage: the run is void.
    for spoilt in (
        {"leases_lost": 1},
        {"prefill_left_after_drain": 0},
        {"pruned_before_drain": 0},
        {"database_outages": 1},
    ):
        void = document([session("pgqueuer", 2, 9_000), featured(30_000, **spoilt)])
        assert verdicts(void)[FEATURED_PGQ] is False, spoilt


def test_every_target_a_run_did_not_measure_is_listed_as_not_measured() -> None:
    doc = document([])
    targets = doc["summary"]["targets"]
    assert [t["target"] for t in targets] == [name for _, name, _ in EXPECTED]
    assert all(t["status"] == "not measured" and t["met"] is None for t in targets)
    text = render(doc)
    for _, name, goal in EXPECTED:
        assert target_line(text, name) == ["not measured", name, goal, "-"]

    # Only the peers missing: ours is measured, every target against a peer is not.
    ours = document([session("jobqueue", 2, 30_000, e2e_jobs_per_s=1_000.0), featured(20_000)])
    status = {t["target"]: t["status"] for t in ours["summary"]["targets"]}
    assert status[FEATURED_PGQ] == status[FEATURED_PROC] == "not measured"
    assert status["drain 2 procs vs PgQueuer (jobs/s)"] == "not measured"
    e2e = "end to end, HTTP submit to completed, 2 procs, vs PgQueuer's in-process producer"
    assert status[f"{e2e} (jobs/s)"] == "not measured"


def test_end_to_end_must_reach_twice_pgqueuers_in_the_same_run() -> None:
    e2e = "end to end, HTTP submit to completed, 2 procs, vs PgQueuer's in-process producer"
    doc = document(
        [
            session("jobqueue", 2, 30_000, e2e_jobs_per_s=4_000.0),
            session("pgqueuer", 2, 9_000, e2e_jobs_per_s=2_000.0),
        ]
    )
    assert verdicts(doc)[f"{e2e} (jobs/s)"] is True
    slower = document(
        [
            session("jobqueue", 2, 30_000, e2e_jobs_per_s=1_000.0),
            session("pgqueuer", 2, 9_000, e2e_jobs_per_s=2_000.0),
        ]
    )
    (target,) = [t for t in slower["summary"]["targets"] if t["target"].startswith(e2e)]
    assert (target["ratio"], target["status"]) == (0.5, "missed")


def test_no_features_flag_skips_the_drain_with_the_features_on_each_repeat() -> None:
    config = parse_args(["--quick", "--server", "postgresql://unused"])
    skipped = parse_args(["--quick", "--no-features", "--server", "postgresql://unused"])
    assert (config.features, skipped.features) == (True, False)
    assert total_steps(config) - total_steps(skipped) == config.repeat
    with pytest.raises(SystemExit):
        parse_args(["--features-prefill", "0", "--server", "postgresql://unused"])


def keys_drain_row(drain: float, cpu: float = 60.0) -> dict[str, Any]:
    return {
        "kind": "keys_drain",
        "processes": 2,
        "workers": 50,
        "jobs": 20_000,
        "keys": 1_000,
        "key_concurrency": "*:2",
        "drain_jobs_per_s": drain,
        "worker_cpu_us_per_job": cpu,
    }


def fairness_row(p99: float, longest: float, a_left: int = 9_000) -> dict[str, Any]:
    return {
        "kind": "keys_fairness",
        "slots": 16,
        "processes": 1,
        "a_jobs": 10_000,
        "b_jobs": 20,
        "delay_s": 1.0,
        "job_seconds": 0.05,
        "p50_ms": p99 / 2,
        "p95_ms": p99,
        "p99_ms": p99,
        "mean_ms": p99 / 2,
        "samples": 20,
        "max_ms": longest,
        "a_pending_after_b": a_left,
    }


KEYS_DRAIN = "drain over 1,000 keys, KEY_CONCURRENCY=*:2, vs no keys (ratio)"
FAIRNESS = (
    "fair dispatch: 20 jobs of a key submitted behind 10,000 of another start within 2 s"
    " (longest wait, ms)"
)


def test_key_drain_is_set_against_the_keyless_drain_of_the_same_run_and_process_count() -> None:
    doc = document(
        [
            session("jobqueue", 2, 10_000, worker_cpu_us_per_job=50.0),
            session("jobqueue", 1, 6_000),
            keys_drain_row(8_100),
        ]
    )
    drain = doc["summary"]["keys"]["drain"]
    assert drain["keyless_jobs_per_s"] == 10_000  # the 2-process drain, not the 1-process
    assert drain["ratio"] == pytest.approx(0.81)
    assert verdicts(doc)[KEYS_DRAIN] is True
    text = render(doc)
    assert (
        "drain of 20,000 no-op jobs over 1,000 keys, KEY_CONCURRENCY=*:2, 2 process(es), "
        "WORKERS=50: 8,100 jobs/s vs no keys 10,000 jobs/s: 0.81x"
    ) in text
    assert "    worker CPU per job 60 µs vs 50 µs without keys" in text

    slower = document([session("jobqueue", 2, 10_000), keys_drain_row(7_900)])
    assert verdicts(slower)[KEYS_DRAIN] is False
    # Without a key-less drain of its process count there is no ratio, and no verdict.
    alone = document([session("jobqueue", 1, 6_000), keys_drain_row(7_900)])
    assert alone["summary"]["keys"]["drain"]["ratio"] is None
    assert [t["status"] for t in alone["summary"]["targets"] if t["target"] == KEYS_DRAIN] == [
        "not measured"
    ]


def test_fairness_is_met_only_if_every_b_job_started_within_2s_while_a_jobs_still_waited() -> None:
    doc = document([fairness_row(250.0, 260.0), fairness_row(300.0, 1_900.0, a_left=8_000)])
    fair = doc["summary"]["keys"]["fairness"]
    assert fair["p99_ms"] == 275.0 and fair["max_ms"] == 1_900.0  # medians; the longest of all
    assert fair["samples"] == 40 and fair["a_pending_after_b"] == 8_000
    assert verdicts(doc)[FAIRNESS] is True
    assert (
        "fairness: 10,000 jobs of key A, 20 of key B 1 s later, 16 slots, jobs of 50 ms: key B"
        " waited p50 138 ms, p99 275 ms, longest 1900 ms (8,000 of key A still pending)"
    ) in render(doc)

    late = document([fairness_row(250.0, 2_100.0)])
    assert verdicts(late)[FAIRNESS] is False
    # Key A drained before B started: B overtook nothing, so the run shows no fairness.
    overtook_nothing = document([fairness_row(250.0, 260.0, a_left=0)])
    assert verdicts(overtook_nothing)[FAIRNESS] is False


def test_no_keys_flag_skips_the_key_paused_and_fairness_runs_of_each_repeat() -> None:
    config = parse_args(["--quick", "--server", "postgresql://unused"])
    skipped = parse_args(["--quick", "--no-keys", "--server", "postgresql://unused"])
    assert (config.keys, skipped.keys, config.fair_jobs) == (True, False, 2_000)
    assert total_steps(config) - total_steps(skipped) == 3 * config.repeat
    with pytest.raises(SystemExit):
        parse_args(["--fair-jobs", "0", "--server", "postgresql://unused"])


PAUSED = "drain beside a paused queue's backlog vs without (ratio)"


def paused_row(drain: float) -> dict[str, Any]:
    return {
        "kind": "keys_paused",
        "processes": 2,
        "workers": 50,
        "jobs": 20_000,
        "paused_backlog": 20_000,
        "drain_jobs_per_s": drain,
        "worker_cpu_us_per_job": 50.0,
    }


def test_the_drain_beside_a_paused_backlog_is_set_against_the_plain_drain_of_its_run() -> None:
    doc = document(
        [session("jobqueue", 2, 10_000), session("jobqueue", 1, 6_000), paused_row(9_600)]
    )
    held = doc["summary"]["keys"]["paused"]
    assert held["plain_jobs_per_s"] == 10_000 and held["ratio"] == pytest.approx(0.96)
    assert verdicts(doc)[PAUSED] is True
    assert (
        "drain of 20,000 no-op jobs beside queue held, paused with 20,000 jobs due, 2 process(es),"
        " WORKERS=50: 9,600 jobs/s vs without 10,000 jobs/s: 0.96x"
    ) in render(doc)
    assert verdicts(document([session("jobqueue", 2, 10_000), paused_row(8_000)]))[PAUSED] is False


EQUAL_1 = "drain at WORKERS=10, 1 proc(s), vs PgQueuer at its defaults (jobs/s)"
EQUAL_2 = "drain at WORKERS=10, 2 proc(s), vs PgQueuer at its defaults (jobs/s)"


def test_the_drain_at_ten_slots_is_set_against_pgqueuers_drain_with_as_many_processes() -> None:
    doc = document(
        [
            session("jobqueue", 1, 9_000, workers=10),
            session("jobqueue", 2, 12_000, workers=10),
            session("jobqueue", 2, 20_000),  # WORKERS=50: not this target's
            session("pgqueuer", 1, 5_000),
            session("pgqueuer", 2, 5_000),
        ]
    )
    text = render(doc)
    assert target_line(text, EQUAL_1) == ["MISSED", EQUAL_1, ">= 2x", "9,000 vs 5,000", "1.80x"]
    assert target_line(text, EQUAL_2) == ["met", EQUAL_2, ">= 2x", "12,000 vs 5,000", "2.40x"]
    alone = render(document([session("jobqueue", 1, 9_000, workers=10)]))
    assert target_line(alone, EQUAL_1)[0] == "not measured"


def pressure_scenario(
    clean: float, pressure: float, p99: tuple[float, float], recovered: float | None, rate=800.0
) -> dict[str, Any]:
    def phase(completed: float, p99_ms: float, target: float) -> dict[str, Any]:
        return {
            "target_rate": target,
            "offered_per_s": target,
            "completed_per_s_median": completed,
            "claim_p50_ms": p99_ms / 3,
            "claim_p99_ms": p99_ms,
            "backlog_max": 7,
        }

    phases = {
        "clean": phase(clean, p99[0], 800.0),
        "pressure": phase(pressure, p99[1], rate),
        "recovery": phase(clean, p99[0], 800.0),
    }
    return {
        "phases": phases,
        "ratios": {"claim_p99_pressure_over_clean": p99[1] / p99[0]},
        "dead_tuples_recovered_s": recovered,
        "first_vacuum_after_release_s": recovered,
        "samples": [{"at": 0.0}],
    }


def test_the_pressure_scenarios_each_end_the_table_with_their_three_targets() -> None:
    measured = {
        "kind": "pressure",
        "scenarios": {
            "idle-xid": pressure_scenario(800, 790, (10.0, 25.0), 40.0),
            # Keeps up with 1.5x the rate: judged against what was offered, not clean.
            "rate-1.5x": pressure_scenario(800, 1_100, (10.0, 31.0), None, rate=1_200.0),
        },
        "errors": [{"scenario": "repeatable-read", "error": "RuntimeError('boom')"}],
    }
    doc = document([measured])
    met = verdicts(doc)
    assert met["pressure idle-xid: completed/s under pressure vs clean (ratio)"] is True
    assert met["pressure idle-xid: claim p99 under pressure vs clean (ratio)"] is True
    assert met["pressure idle-xid: jobs table under 10,000 dead tuples after the release (s)"]
    rate = "pressure rate-1.5x: completed/s under pressure vs offered (ratio)"
    assert met[rate] is True  # 1,100 of 1,200 offered: 0.92
    assert met["pressure rate-1.5x: claim p99 under pressure vs clean (ratio)"] is False
    assert (
        met["pressure rate-1.5x: jobs table under 10,000 dead tuples after the release (s)"]
        is False
    )
    # A scenario that failed misses each of its targets rather than disappearing.
    assert [t for t, ok in met.items() if t.startswith("pressure repeatable-read")] == [
        "pressure repeatable-read: completed/s under pressure vs clean (ratio)",
        "pressure repeatable-read: claim p99 under pressure vs clean (ratio)",
        "pressure repeatable-read: jobs table under 10,000 dead tuples after the release (s)",
    ]
    assert not any(ok for t, ok in met.items() if t.startswith("pressure repeatable-read"))
    text = render(doc)
    assert target_line(text, rate) == ["met", rate, ">= 0.90", "0.92x"]
    assert "Under pressure (bench.pressure" in text
    assert "repeatable-read: FAILED: RuntimeError('boom')" in text
    assert "samples" not in doc["summary"]["pressure"]["scenarios"]["idle-xid"]


def test_pressure_runs_with_the_peers_unless_turned_off_and_counts_a_step_per_phase() -> None:
    url = ["--server", "postgresql://unused"]
    assert parse_args(["--quick", *url]).pressure is False
    compared = parse_args(["--quick", "--compare", *url])
    assert compared.pressure is True and compared.pressure_quick is True
    off = parse_args(["--quick", "--compare", "--no-pressure", *url])
    assert total_steps(compared) - total_steps(off) == 1 + 3 * 3
    unmeasured = render(document([session("jobqueue", 2, 10_000)]))
    line = "pressure idle-xid: claim p99 under pressure vs clean (ratio)"
    assert target_line(unmeasured, line) == ["not measured", line, "<= 3", "-"]


LOADED = "pickup p99 from commit with other work on the machine (ms)"


def test_the_pickup_with_other_work_on_the_machine_has_a_target_of_its_own() -> None:
    def loaded(p99: float) -> dict[str, Any]:
        figures = {"p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": p99}
        trip = {"p50_ms": 0.3, "p99_ms": p99 - 1}
        return {
            "pickup_loaded": {
                "from_commit": figures,
                "round_trip": trip,
                "load_average": 1.9,
                "spinners": 2,
            }
        }

    doc = document(
        [
            session("jobqueue", 2, 10_000, **pickup(1.0), **loaded(4.0)),
            session("jobqueue", 2, 10_000, **pickup(1.0), **loaded(9.0)),
            session("jobqueue", 2, 10_000, **pickup(1.0), **loaded(6.0)),
        ]
    )
    text = render(doc)
    assert target_line(text, LOADED) == ["MISSED", LOADED, "<= 5", "6.00"]
    assert (
        "pickup from commit with 2 processes spinning on the CPU (load average 1.9 at the end),"
        " p50/p95/p99 ms: jobqueue: 1.00/2.00/6.00; one SELECT 1 round trip meanwhile, p50/p99"
        " ms: 0.30/5.00" in text
    )
    met = render(document([session("jobqueue", 2, 10_000, **pickup(1.0), **loaded(4.9))]))
    assert target_line(met, LOADED)[0] == "met"
    assert target_line(render(document([session("jobqueue", 2, 10_000)])), LOADED)[0] == (
        "not measured"
    )


def test_the_spinning_processes_run_for_the_block_and_are_gone_after_it() -> None:
    from bench.measure import busy

    with busy(2) as pids:
        assert len(pids) == 2
        for pid in pids:
            os.kill(pid, 0)  # running
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
