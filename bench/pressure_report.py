"""`make bench-pressure`'s arithmetic and its table: the figures of one phase from what was
sampled in it, the ratios to the clean phase, when the dead tuples were back under their
threshold, and the text printed on stdout. Pure functions, tested in `make test`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.stats import latency_ms, median, ratio

SCENARIOS = ("idle-xid", "repeatable-read", "rate-1.5x")
PHASES = ("clean", "pressure", "recovery")
# The jobs table counts as recovered once its dead tuples are under this again.
DEAD_TUPLES_RECOVERED = 10_000

# The targets (docs/pressure.md): completions under pressure at least this share of what the clean
# phase completed (of what was offered, where the pressure is a higher rate), claim p99 at
# most this many times the clean phase's, dead tuples recovered within this many seconds.
COMPLETION_TARGET = 0.90
CLAIM_P99_TARGET = 3.0
RECOVERED_WITHIN_S = 300.0


def per_second(counts: Mapping[int, int], seconds: float) -> list[int]:
    """Completions in each whole second of a phase `seconds` long, from {second since the
    phase's start: count}. A second without any counts 0 (a collapse must weigh in the
    median); the partial second at the end is left out."""
    return [counts.get(s, 0) for s in range(int(seconds))]


def phase_of(at: float, bounds: Mapping[str, tuple[float, float]]) -> str | None:
    """The phase whose [start, end) holds the time `at`, or None (before, between, after)."""
    for phase, (start, end) in bounds.items():
        if start <= at < end:
            return phase
    return None


def phase_figures(
    *,
    seconds: float,
    completions: Mapping[int, int],
    target_rate: float,
    offered: int,
    accepted: int,
    latencies: Sequence[float],
    requests: Sequence[float],
    backlog: Sequence[int],
    backlog_end: int,
    relations: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """One phase's figures. `latencies`: handler start − run_at (seconds) of the sampled jobs
    that started in the phase; `requests`: each of its batches' tick to answer;
    `backlog`: the pending counts sampled during it."""
    buckets = per_second(completions, seconds)
    claim = latency_ms(latencies) if latencies else None
    return {
        "seconds": seconds,
        "target_rate": target_rate,
        "offered_per_s": offered / seconds if seconds else 0.0,
        "accepted_per_s": accepted / seconds if seconds else 0.0,
        "completed": sum(buckets),
        "completed_per_s_median": median(buckets) if buckets else 0.0,
        "completed_per_s_min": min(buckets, default=0),
        "claim_p50_ms": claim["p50_ms"] if claim else None,
        "claim_p99_ms": claim["p99_ms"] if claim else None,
        "claim_samples": len(latencies),
        "batch_p99_ms": latency_ms(requests)["p99_ms"] if requests else None,
        "backlog_max": max([*backlog, backlog_end]),
        "backlog_end": backlog_end,
        "relations": list(relations),
    }


def ratios(phases: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    """Pressure and recovery against clean: the median completion rate and claim p99."""
    out: dict[str, float | None] = {}
    clean = phases.get("clean", {})
    for phase in ("pressure", "recovery"):
        for key, name in (("completed_per_s_median", "completion"), ("claim_p99_ms", "claim_p99")):
            ours, base = phases.get(phase, {}).get(key), clean.get(key)
            out[f"{name}_{phase}_over_clean"] = (
                ratio(ours, base) if ours is not None and base else None
            )
    return out


def recovered_after(
    samples: Sequence[tuple[float, int]], released: float, threshold: int = DEAD_TUPLES_RECOVERED
) -> float | None:
    """Seconds from `released` to the first (time, dead tuples) sample at or after it that is
    under `threshold`; None if no sample is."""
    for at, dead in sorted(samples):
        if at >= released and dead < threshold:
            return at - released
    return None


def first_vacuum_after(samples: Sequence[tuple[float, int]], released: float) -> float | None:
    """Seconds from `released` to the first (time, vacuums finished) sample whose count is
    above the last one before `released`: when a vacuum had finished by; None if none did."""
    ordered = sorted(samples)
    before = [n for at, n in ordered if at < released]
    if not before:
        return None
    for at, n in ordered:
        if at >= released and n > before[-1]:
            return at - released
    return None


def completion_ratio(scenario: Mapping[str, Any]) -> float | None:
    """Completions under pressure against the clean phase's; where the pressure is a higher
    offered rate, against that rate, which the queue must keep up with."""
    phases = scenario["phases"]
    clean, pressure = phases["clean"], phases["pressure"]
    stepped = pressure["target_rate"] / clean["target_rate"] if clean["target_rate"] else 1.0
    base = clean["completed_per_s_median"] * stepped
    return pressure["completed_per_s_median"] / base if base else None


def summarize(measured: Mapping[str, Any]) -> dict[str, Any]:
    """What the queue benchmark's report keeps of a run of `bench.pressure.execute`: per
    scenario its phases' figures (without the per-second samples) and its ratios."""
    keep = ("phases", "ratios", "dead_tuples_recovered_s", "first_vacuum_after_release_s")
    return {
        "scenarios": {
            name: {key: scenario[key] for key in keep}
            | {"completion_ratio": completion_ratio(scenario)}
            for name, scenario in measured.get("scenarios", {}).items()
        },
        "errors": [
            {"scenario": e["scenario"], "error": e["error"]} for e in measured.get("errors", [])
        ],
    }


def expected() -> list[tuple[str, str, str]]:
    """The targets' lines for the report's table when they were not measured: (a part of the
    name, the name, the goal), in the order of `targets()`."""
    out = []
    for name in SCENARIOS:
        out += [
            (
                f"pressure {name}: completed/s",
                f"pressure {name}: completed/s under pressure (ratio)",
                f">= {COMPLETION_TARGET:.2f}",
            ),
            (
                f"pressure {name}: claim p99",
                f"pressure {name}: claim p99 under pressure vs clean (ratio)",
                f"<= {CLAIM_P99_TARGET:g}",
            ),
            (
                f"pressure {name}: jobs table",
                f"pressure {name}: jobs table under "
                f"{DEAD_TUPLES_RECOVERED:,} dead tuples after the release (s)",
                f"<= {RECOVERED_WITHIN_S:.0f}",
            ),
        ]
    return out


def lines(summary: Mapping[str, Any]) -> list[str]:
    """The report's section: per scenario and phase the rate, claim latency and backlog."""
    if not summary.get("scenarios") and not summary.get("errors"):
        return []
    rows = []
    for name, scenario in summary.get("scenarios", {}).items():
        for phase, f in scenario["phases"].items():
            rows.append(
                [
                    name,
                    phase,
                    _n(f["offered_per_s"]),
                    _n(f["completed_per_s_median"]),
                    _n(f["claim_p50_ms"], 1),
                    _n(f["claim_p99_ms"], 1),
                    _n(f["backlog_max"]),
                ]
            )
    header = ["scenario", "phase", "offered/s", "completed/s (median)", "claim p50 ms"]
    header += ["claim p99 ms", "backlog max"]
    out = ["", "Under pressure (bench.pressure: 2 x 16 slots, a fixed offered rate)"]
    out += _table(header, rows) if rows else []
    out += [f"  {e['scenario']}: FAILED: {e['error']}" for e in summary.get("errors", [])]
    return out


def targets(measured: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per scenario run, its three targets, each `{target, goal, measured, met}` as the queue
    benchmark's table lists them; a scenario that failed misses all three."""
    out = []
    failed = {error["scenario"] for error in measured.get("errors", [])}
    for name in [*measured.get("scenarios", {}), *sorted(failed)]:
        scenario = measured.get("scenarios", {}).get(name)
        stepped = scenario is not None and (
            scenario["phases"]["pressure"]["target_rate"]
            != scenario["phases"]["clean"]["target_rate"]
        )
        completion = completion_ratio(scenario) if scenario else None
        p99 = scenario["ratios"]["claim_p99_pressure_over_clean"] if scenario else None
        after = scenario["dead_tuples_recovered_s"] if scenario else None
        out += [
            {
                "target": f"pressure {name}: completed/s under pressure vs "
                + ("offered (ratio)" if stepped else "clean (ratio)"),
                "goal": f">= {COMPLETION_TARGET:.2f}",
                "measured": completion,
                "met": completion is not None and completion >= COMPLETION_TARGET,
            },
            {
                "target": f"pressure {name}: claim p99 under pressure vs clean (ratio)",
                "goal": f"<= {CLAIM_P99_TARGET:g}",
                "measured": p99,
                "met": p99 is not None and p99 <= CLAIM_P99_TARGET,
            },
            {
                "target": f"pressure {name}: jobs table under {DEAD_TUPLES_RECOVERED:,} dead "
                "tuples after the release (s)",
                "goal": f"<= {RECOVERED_WITHIN_S:.0f}",
                "measured": after,
                "met": after is not None and after <= RECOVERED_WITHIN_S,
            },
        ]
    return out


# --- text ------------------------------------------------------------------------


def _n(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [header, *rows]
    ]
    return [lines[0], "  ".join("-" * w for w in widths), *lines[1:]]


def _dead_jobs(figures: Mapping[str, Any], jobs: str) -> int | None:
    found = [r["n_dead_tup"] for r in figures["relations"] if r["name"] == jobs]
    return found[0] if found else None


def _relation(rel: Mapping[str, Any]) -> str:
    size = f"{rel['bytes'] / 2**20:,.2f} MB"
    return f"{rel['n_dead_tup']:,} / {size}" if rel["kind"] == "table" else size


def render(document: Mapping[str, Any]) -> str:
    config, jobs = document["config"], document["jobs_table"]
    vacuum = document["vacuum"]
    out = [
        f"Pressure benchmark: one jobqueue-api, jobqueue-worker WORKER_PROCESSES="
        f"{config['processes']} x WORKERS={config['workers']}, no-op jobs by POST /jobs/batch "
        f"every {config['tick'] * 1000:.0f} ms at {config['rate']:,.0f}/s; phases "
        f"{config['clean']:g} s / {config['pressure']:g} s / {config['recovery']:g} s",
        f"vacuum: {vacuum}; claim latency = handler start - run_at, 1 job in "
        f"{config['mark_every']} sampled",
        "",
    ]
    header = ["scenario", "phase", "offered/s", "accepted/s", "completed/s (median)", "min/s"]
    header += ["claim p50 ms", "claim p99 ms", "backlog max", "backlog end"]
    header += [f"{jobs} n_dead_tup", "batch p99 ms"]
    rows = []
    for name, scenario in document["scenarios"].items():
        for phase, f in scenario["phases"].items():
            cells = [name, phase, _n(f["offered_per_s"]), _n(f["accepted_per_s"])]
            cells += [_n(f["completed_per_s_median"]), _n(f["completed_per_s_min"])]
            cells += [_n(f["claim_p50_ms"], 1), _n(f["claim_p99_ms"], 1)]
            dead = _dead_jobs(f, scenario["jobs_relation"])
            cells += [_n(f["backlog_max"]), _n(f["backlog_end"]), _n(dead)]
            cells.append(_n(f["batch_p99_ms"], 1))
            rows.append(cells)
    out += _table(header, rows)
    for name, scenario in document["scenarios"].items():
        r = scenario["ratios"]
        after = scenario["dead_tuples_recovered_s"]
        recovered = "not within the phase" if after is None else f"{after:.0f} s after the release"
        vacuumed = scenario["first_vacuum_after_release_s"]
        recovered += (
            "; no vacuum finished"
            if vacuumed is None
            else (f"; the first vacuum after the release had finished {vacuumed:.0f} s after it")
        )
        out += [
            "",
            f"{name}: completion rate pressure/clean {_n(r['completion_pressure_over_clean'], 2)}"
            f", recovery/clean {_n(r['completion_recovery_over_clean'], 2)}; claim p99 "
            f"pressure/clean {_n(r['claim_p99_pressure_over_clean'], 2)}, recovery/clean "
            f"{_n(r['claim_p99_recovery_over_clean'], 2)}",
            f"{name}: {jobs} dead tuples under {DEAD_TUPLES_RECOVERED:,}: {recovered}",
        ]
        if scenario.get("holder"):
            held = ", ".join(f"{k} {v}" for k, v in scenario["holder"].items())
            out.append(f"{name}: horizon holder: {held}")
        out += ["", f"{name}: at the end of each phase (tables: dead tuples / size; indexes: size)"]
        at_end = {
            phase: {rel["name"]: rel for rel in f["relations"]}
            for phase, f in scenario["phases"].items()
        }
        rows = []
        for rel in scenario["phases"]["clean"]["relations"]:
            cells = [rel["name"], rel["kind"]]
            for phase in scenario["phases"]:
                now = at_end[phase].get(rel["name"])
                cells.append(_relation(now) if now else "-")
            rows.append(cells)
        out += _table(["relation", "kind", *scenario["phases"]], rows)
    for error in document["errors"]:
        out += ["", f"{error['scenario']}: FAILED: {error['error']}"]
    return "\n".join(out)
