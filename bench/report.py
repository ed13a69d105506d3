"""From raw results to medians, ratios and target verdicts (`summarize`), and the text table.

The targets are gathered into one list (`summary["targets"]`, the table that ends the
report): those computed here from the systems' figures, and each step's own (its module's
`targets()`), in the order of `EXPECTED`; a target whose figures the run did not measure
(a step skipped, no peers) is listed as "not measured" rather than left out.
"""

from __future__ import annotations

from typing import Any

from bench import (
    client,
    costs,
    features,
    keys,
    listing,
    pressure_report,
    retention,
    scheduling,
    waiting,
    webhooks,
)
from bench.stats import median

OURS = "jobqueue"
PICKUP = [
    (origin, p) for origin in ("from_commit", "from_call") for p in ("p50_ms", "p95_ms", "p99_ms")
]


def _med(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in rows if row.get(key) is not None]
    return median(values) if values else None


def _system(sessions: list[dict[str, Any]]) -> dict[str, Any]:
    one = [r for r in sessions if r["processes"] == 1]
    two = [r for r in sessions if r["processes"] == 2]
    figures: dict[str, Any] = {
        "drain_1proc_jobs_per_s": _med(one, "drain_jobs_per_s"),
        "drain_2proc_jobs_per_s": _med(two, "drain_jobs_per_s"),
        "bulk_enqueue_jobs_per_s": _med(sessions, "bulk_enqueue_jobs_per_s"),
        # Measured in the session with the most processes only.
        "e2e_jobs_per_s": _med(sessions, "e2e_jobs_per_s"),
        "e2e_submit_jobs_per_s": _med(sessions, "e2e_submit_jobs_per_s"),
    }
    split = [r["e2e_cpu_ms_per_job"] for r in sessions if "e2e_cpu_ms_per_job" in r]
    if split:
        figures["e2e_cpu_ms_per_job"] = {
            part: median([s[part] for s in split if part in s])
            for part in dict.fromkeys(part for s in split for part in s)
        }
    for origin, p in PICKUP:
        figures[f"pickup_{origin}_{p}"] = _med(
            [r["pickup"][origin] for r in sessions if "pickup" in r], p
        )
    loaded = [r["pickup_loaded"] for r in sessions if "pickup_loaded" in r]
    for p in ("p50_ms", "p95_ms", "p99_ms"):
        figures[f"pickup_loaded_from_commit_{p}"] = _med([r["from_commit"] for r in loaded], p)
    for p in ("p50_ms", "p99_ms"):
        figures[f"pickup_loaded_round_trip_{p}"] = _med(
            [r["round_trip"] for r in loaded if "round_trip" in r], p
        )
    figures["pickup_loaded_load_average"] = _med(loaded, "load_average")
    figures["pickup_loaded_spinners"] = _med(loaded, "spinners")
    return {key: value for key, value in figures.items() if value is not None}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(document: dict[str, Any]) -> dict[str, Any]:
    results = document["results"]
    config = document["config"]
    sessions = [r for r in results if r["kind"] == "session"]
    summary: dict[str, Any] = {"systems": {}, "ratios": {}}
    names = list(dict.fromkeys(r["system"] for r in sessions))
    for name in names:
        rows = [
            r
            for r in sessions
            if r["system"] == name and (name != OURS or r["workers"] == config["workers"])
        ]
        summary["systems"][name] = _system(rows)

    e2e = [r["processes"] for r in sessions if r["system"] == OURS and "e2e_jobs_per_s" in r]
    if e2e:
        summary["e2e_processes"] = max(e2e)
    ours = summary["systems"].get(OURS)
    if ours is not None:
        sweep: dict[str, dict[str, float]] = {}
        for workers in sorted({r["workers"] for r in sessions if r["system"] == OURS}):
            for processes in (1, 2):
                rows = [
                    r
                    for r in sessions
                    if r["system"] == OURS
                    and r["workers"] == workers
                    and r["processes"] == processes
                ]
                value = _med(rows, "drain_jobs_per_s")
                if value is not None:
                    sweep.setdefault(str(workers), {})[f"{processes}proc_jobs_per_s"] = value
        ours["drain_by_workers"] = sweep
        single = [r for r in results if r["kind"] == "http_single"]
        if single:
            ours["http_single"] = {
                key: _med(single, key) for key in ("jobs_per_s", "p50_ms", "p99_ms", "concurrency")
            }
        batch = [r for r in results if r["kind"] == "http_batch"]
        if batch:
            ours["http_batch_jobs_per_s"] = _med(batch, "jobs_per_s")

        for peer in names:
            if peer in (OURS, features.SYSTEM):
                continue
            theirs = summary["systems"][peer]
            ratios = {
                "drain_1proc": _ratio(
                    ours.get("drain_1proc_jobs_per_s"), theirs.get("drain_1proc_jobs_per_s")
                ),
                "drain_2proc": _ratio(
                    ours.get("drain_2proc_jobs_per_s"), theirs.get("drain_2proc_jobs_per_s")
                ),
                "e2e": _ratio(ours.get("e2e_jobs_per_s"), theirs.get("e2e_jobs_per_s")),
                "bulk_enqueue": _ratio(
                    ours.get("bulk_enqueue_jobs_per_s"), theirs.get("bulk_enqueue_jobs_per_s")
                ),
                "pickup_from_commit_p50": _ratio(
                    ours.get("pickup_from_commit_p50_ms"), theirs.get("pickup_from_commit_p50_ms")
                ),
                "pickup_from_commit_p99": _ratio(
                    ours.get("pickup_from_commit_p99_ms"), theirs.get("pickup_from_commit_p99_ms")
                ),
            }
            summary["ratios"][peer] = {k: v for k, v in ratios.items() if v is not None}

    profiles = [r["profile"] for r in sessions if r.get("profile")]
    if profiles:
        summary["profile"] = profiles[0]
    backlog = [r for r in results if r["kind"] == "backlog"]
    if backlog:
        summary["backlog"] = _backlog(backlog, config)
    hooks = [r for r in results if r["kind"] == "webhooks"]
    if hooks:
        summary["webhooks"] = webhooks.summarize(hooks)
    routed = scheduling.summarize(results, summary["systems"].get(OURS, {}))
    if routed:
        summary["scheduling"] = routed
    featured = features.summarize(results, summary["systems"])
    if featured:
        summary["features"] = featured
    plain = [r for r in sessions if r["system"] == OURS and r["workers"] == config["workers"]]
    keyed = keys.summarize(results, plain)
    if keyed:
        summary["keys"] = keyed
    priced = costs.summarize(results)
    if priced:
        summary["costs"] = priced
    listed = listing.summarize(results)
    if listed:
        summary["listing"] = listed
    waited = waiting.summarize(results)
    if waited:
        summary["waiting"] = waited
    kept = retention.summarize(results)
    if kept:
        summary["retention"] = kept
    enqueued = client.summarize(results)
    if enqueued:
        summary["client"] = enqueued
    pressed = [r for r in results if r["kind"] == "pressure"]
    if pressed:
        summary["pressure"] = pressure_report.summarize(pressed[0])
    summary["targets"] = _targets(summary)
    return summary


def _backlog(rows: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "rows": {
            "completed": config["backlog_completed"],
            "pending": config["backlog_pending"],
        },
        "claim_n": config["claim_n"],
        "drain_window": config["backlog_window"],
    }
    for table in ("empty", "backlog"):
        mine = [r for r in rows if r["table"] == table]
        if not mine:
            return out
        out[table] = {
            "claim_p50_ms": median([r["claim"]["p50_ms"] for r in mine]),
            "claim_p99_ms": median([r["claim"]["p99_ms"] for r in mine]),
            "drain_jobs_per_s": median([r["drain_jobs_per_s"] for r in mine]),
        }
    diff = {
        key: (out["backlog"][key] - out["empty"][key]) / out["empty"][key] * 100
        for key in out["empty"]
    }
    out["difference_pct"] = diff
    # Slower means a higher latency or a lower rate; only that direction counts against us.
    out["within_20pct"] = (
        diff["claim_p50_ms"] <= 20
        and diff["claim_p99_ms"] <= 20
        and diff["drain_jobs_per_s"] >= -20
    )
    return out


PEER_NAMES = {"pgqueuer": "PgQueuer", "procrastinate": "Procrastinate"}
PICKUP_TARGETS = (("p50", 1.5), ("p99", 5.0))
LOADED_PICKUP_TARGET = 5.0  # p99 from commit, ms, with other work on the machine
EQUAL_WORKERS = 10  # our drain at this WORKERS against PgQueuer's defaults (batch 10)
EQUAL_TARGET = 2.0
E2E_TARGET = 2.0  # our end to end over PgQueuer's, at least
BATCH_TARGET = 40_000.0  # jobs/s through POST /jobs/batch


def _versus(
    name: str, goal: str, ours: float | None, theirs: float | None, bound: float
) -> dict[str, Any] | None:
    """A target on the ratio of our rate to a peer's: both rates and the ratio."""
    if ours is None or not theirs:
        return None
    ratio = ours / theirs
    return {
        "target": name,
        "goal": goal,
        "measured": ours,
        "versus": theirs,
        "ratio": ratio,
        "met": ratio >= bound,
    }


def _bounded(name: str, value: float | None, way: str, bound: float) -> dict[str, Any] | None:
    """A target on one figure of ours: at most (`<=`) or at least (`>=`) `bound`."""
    if value is None:
        return None
    met = value <= bound if way == "<=" else value >= bound
    return {"target": name, "goal": f"{way} {bound:g}", "measured": value, "met": met}


def _systems_targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets on the figures of `summary["systems"]`: drains and end to end against the
    peers, idle pickup, bulk submit over HTTP."""
    systems = summary["systems"]
    ours = systems.get(OURS, {})
    out: list[dict[str, Any] | None] = []
    for peer, bound in (("pgqueuer", 2.0), ("procrastinate", 10.0)):
        out.append(
            _versus(
                f"drain 2 procs vs {PEER_NAMES[peer]} (jobs/s)",
                f">= {bound:g}x",
                ours.get("drain_2proc_jobs_per_s"),
                systems.get(peer, {}).get("drain_2proc_jobs_per_s"),
                bound,
            )
        )
    equal = ours.get("drain_by_workers", {}).get(str(EQUAL_WORKERS), {})
    for processes in (1, 2):
        out.append(
            _versus(
                f"drain at WORKERS={EQUAL_WORKERS}, {processes} proc(s), vs PgQueuer at its "
                "defaults (jobs/s)",
                f">= {EQUAL_TARGET:g}x",
                equal.get(f"{processes}proc_jobs_per_s"),
                systems.get("pgqueuer", {}).get(f"drain_{processes}proc_jobs_per_s"),
                EQUAL_TARGET,
            )
        )
    for p, bound in PICKUP_TARGETS:
        value = ours.get(f"pickup_from_commit_{p}_ms")
        out.append(_bounded(f"idle pickup {p} from commit (ms)", value, "<=", bound))
    out.append(
        _bounded(
            "pickup p99 from commit with other work on the machine (ms)",
            ours.get("pickup_loaded_from_commit_p99_ms"),
            "<=",
            LOADED_PICKUP_TARGET,
        )
    )
    e2e = summary.get("e2e_processes")
    out.append(
        _versus(
            f"end to end, HTTP submit to completed, {e2e} procs, vs PgQueuer's in-process "
            "producer (jobs/s)",
            f">= {E2E_TARGET:g}x" + ("" if e2e == 2 else " (stated for 2 procs)"),
            ours.get("e2e_jobs_per_s"),
            systems.get("pgqueuer", {}).get("e2e_jobs_per_s"),
            E2E_TARGET,
        )
    )
    out.append(
        _bounded(
            "bulk submit via POST /jobs/batch (jobs/s)",
            ours.get("http_batch_jobs_per_s"),
            ">=",
            BATCH_TARGET,
        )
    )
    return [t for t in out if t is not None]


# Every target of the run, in the order of the table: a part of the name each target's line
# holds (the modules name theirs with the figures of the run), and the name and goal of its
# line when it was not measured.
EXPECTED = [
    ("drain 2 procs vs PgQueuer", "drain 2 procs vs PgQueuer (jobs/s)", ">= 2x"),
    ("drain 2 procs vs Procrastinate", "drain 2 procs vs Procrastinate (jobs/s)", ">= 10x"),
    (
        "with the features on vs PgQueuer",
        features.target_name(features.STATED_PROCESSES, "pgqueuer"),
        f">= {features.PEERS['pgqueuer'][1]:g}x",
    ),
    (
        "with the features on vs Procrastinate",
        features.target_name(features.STATED_PROCESSES, "procrastinate"),
        f">= {features.PEERS['procrastinate'][1]:g}x",
    ),
    *[
        (
            f"drain at WORKERS={EQUAL_WORKERS}, {n} proc(s)",
            f"drain at WORKERS={EQUAL_WORKERS}, {n} proc(s), vs PgQueuer at its defaults (jobs/s)",
            f">= {EQUAL_TARGET:g}x",
        )
        for n in (1, 2)
    ],
    ("idle pickup p50 from commit", "idle pickup p50 from commit (ms)", "<= 1.5"),
    ("idle pickup p99 from commit", "idle pickup p99 from commit (ms)", "<= 5"),
    (
        "pickup p99 from commit with other work",
        "pickup p99 from commit with other work on the machine (ms)",
        f"<= {LOADED_PICKUP_TARGET:g}",
    ),
    (
        "scheduled-job lateness p99",
        "scheduled-job lateness p99 (ms)",
        f"<= {scheduling.LATENESS_TARGET_MS:.0f}",
    ),
    (
        "scheduled jobs never start early",
        "scheduled jobs never start early (earliest lateness, ms)",
        ">= 0",
    ),
    (
        "?wait= answered after the finishing commit",
        "GET /jobs/{id}?wait= answered after the finishing commit, p99 (ms)",
        f"<= {waiting.LATENCY_TARGET_MS:g}",
    ),
    (
        "list page of",
        f"list page of {listing.LIMIT} p99, every filter, first and deep page, "
        f"{listing.TARGET_ROWS:,} jobs (ms)",
        f"< {listing.TARGET_P99_MS:g}",
    ),
    (
        "end to end, HTTP submit to completed",
        "end to end, HTTP submit to completed, 2 procs, vs PgQueuer's in-process producer (jobs/s)",
        f">= {E2E_TARGET:g}x",
    ),
    (
        "bulk submit via POST /jobs/batch",
        "bulk submit via POST /jobs/batch (jobs/s)",
        f">= {BATCH_TARGET:.0f}",
    ),
    (
        "concurrent waiters on one API process",
        "concurrent waiters on one API process all answered, its database connections "
        "within its pool (answered)",
        "= waiters",
    ),
    (
        "drain over two queues",
        "drain over two queues, mixed priorities, vs one queue (ratio)",
        f">= {scheduling.RATIO_TARGET:.2f}",
    ),
    (
        "keys, KEY_CONCURRENCY=",
        f"drain over {keys.KEYS:,} keys, KEY_CONCURRENCY={keys.KEY_CONCURRENCY}, vs no keys "
        "(ratio)",
        f">= {keys.DRAIN_TARGET:.2f}",
    ),
    (
        "drain beside a paused queue",
        "drain beside a paused queue's backlog vs without (ratio)",
        f">= {keys.PAUSED_TARGET:.2f}",
    ),
    (
        "fair dispatch:",
        f"fair dispatch: {keys.B_JOBS} jobs of a key submitted behind 10,000 of another start "
        f"within {keys.WAIT_TARGET_MS / 1000:g} s (longest wait, ms)",
        f"<= {keys.WAIT_TARGET_MS:.0f}",
    ),
    (
        "drain with heartbeats renewing",
        "drain with heartbeats renewing vs none due, no lease lost (ratio)",
        f">= {costs.HEARTBEAT_TARGET:.2f}",
    ),
    (
        "under TYPE_CONCURRENCY",
        "drain with a type under TYPE_CONCURRENCY vs no limits (ratio)",
        f">= {costs.LIMITS_TARGET:.2f}",
    ),
    (
        "drain while retention prunes",
        "drain while retention prunes old jobs vs retention off (ratio)",
        f">= {retention.PRUNE_TARGET:.2f}",
    ),
    (
        "passed through with retention on",
        "a table jobs passed through with retention on vs a fresh one, within "
        f"{retention.CHURN_TARGET_PCT:g}%",
        "claim p50/p99 and drain",
    ),
    (
        "expired jobs of that table",
        "retention of the expired jobs of that table (RETENTION_COMPLETED=1h, from the "
        "worker's start)",
        f"<= {retention.RETENTION_TARGET_S:g} s",
    ),
    ("backlog within 20%", "backlog within 20% of empty table", "claim p50/p99 and drain"),
    (
        "transactional enqueue_many",
        "transactional enqueue_many on asyncpg, several connections (jobs/s)",
        f">= {client.ENQUEUE_TARGET:,.0f}",
    ),
    (
        "webhooks to a local sink",
        "webhooks to a local sink, per worker process (jobs/s)",
        f">= {webhooks.TARGET_PER_PROCESS:.0f}, no retries",
    ),
    *pressure_report.expected(),
]


def _targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    gathered = _systems_targets(summary)
    gathered += features.targets(summary.get("features", {}))
    gathered += scheduling.targets(summary.get("scheduling", {}))
    gathered += waiting.targets(summary.get("waiting", {}))
    gathered += listing.targets(summary.get("listing", {}))
    gathered += keys.targets(summary.get("keys", {}))
    gathered += costs.targets(summary.get("costs", {}))
    gathered += retention.targets(summary.get("retention", {}))
    gathered += client.targets(summary.get("client", {}))
    gathered += pressure_report.targets(summary.get("pressure", {}))
    hooks = summary.get("webhooks")
    if hooks:
        gathered.append(
            {
                "target": "webhooks to a local sink, per worker process (jobs/s)",
                "goal": f">= {webhooks.TARGET_PER_PROCESS:.0f}, no retries",
                "measured": hooks["jobs_per_s_per_process"],
                "met": hooks["target_met"],
            }
        )
    backlog = summary.get("backlog", {})
    if "within_20pct" in backlog:
        gathered.append(
            {
                "target": "backlog within 20% of empty table",
                "goal": "claim p50/p99 and drain",
                "measured": backlog["difference_pct"],
                "met": backlog["within_20pct"],
            }
        )
    out: list[dict[str, Any]] = []
    taken: set[int] = set()
    for part, name, goal in EXPECTED:
        found = [i for i, t in enumerate(gathered) if i not in taken and part in t["target"]]
        taken.update(found)
        out += [gathered[i] for i in found]
        if not found:
            out.append({"target": name, "goal": goal, "measured": None, "met": None})
    # A target of a step that EXPECTED does not know yet still gets its line, at the end.
    out += [t for i, t in enumerate(gathered) if i not in taken]
    return [_verdict(t) for t in out]


def _verdict(target: dict[str, Any]) -> dict[str, Any]:
    """The target with its `status` (met, missed, not measured) and, for a ratio, `ratio`."""
    status = "not measured" if target["met"] is None else "met" if target["met"] else "missed"
    ratio = target.get("ratio")
    if ratio is None and target["target"].endswith("(ratio)"):
        ratio = target["measured"]
    return {**target, "ratio": ratio, "status": status}


# --- text ------------------------------------------------------------------------


def _n(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render(document: dict[str, Any]) -> str:
    summary = document["summary"]
    config = document["config"]
    systems = summary["systems"]
    out = [
        f"Queue benchmarks: {document['machine']['cpus']} CPUs, PostgreSQL "
        f"{document['machine']['postgresql']}, drain of {config['jobs']:,} no-op jobs, "
        f"medians of {config['repeat']} repeat(s); our WORKERS={config['workers']}",
    ]
    code = document.get("code")
    if code:
        dirty = " (with uncommitted changes)" if code["uncommitted_changes"] else ""
        out.append(f"code: {code['commit'][:12]}{dirty}")
    out += [
        "",
    ]
    rows = []
    for name, figures in systems.items():
        version = document["systems"].get(name, {}).get("version", "")
        rows.append(
            [
                f"{name} {version}",
                _n(figures.get("drain_1proc_jobs_per_s")),
                _n(figures.get("drain_2proc_jobs_per_s")),
                _n(figures.get("e2e_jobs_per_s")),
                "/".join(
                    _n(figures.get(f"pickup_from_commit_{p}"), 2)
                    for p in ("p50_ms", "p95_ms", "p99_ms")
                ),
                "/".join(
                    _n(figures.get(f"pickup_from_call_{p}"), 2)
                    for p in ("p50_ms", "p95_ms", "p99_ms")
                ),
                _n(figures.get("bulk_enqueue_jobs_per_s")),
            ]
        )
    for peer, ratios in summary["ratios"].items():
        rows.append(
            [
                f"ratio {OURS}/{peer}",
                _n(ratios.get("drain_1proc"), 2) + "x",
                _n(ratios.get("drain_2proc"), 2) + "x",
                _n(ratios.get("e2e"), 2) + "x",
                _n(ratios.get("pickup_from_commit_p50"), 2) + "x p50",
                "",
                _n(ratios.get("bulk_enqueue"), 2) + "x",
            ]
        )
    out.append(
        _table(
            [
                "system",
                "drain 1 proc/s",
                "drain 2 procs/s",
                "e2e jobs/s",
                "pickup from commit p50/p95/p99 ms",
                "from call p50/p95/p99 ms",
                "bulk enqueue/s",
            ],
            rows,
        )
    )
    for name, figures in systems.items():
        if figures.get("pickup_loaded_from_commit_p99_ms") is not None:
            out.append(
                f"pickup from commit with {figures['pickup_loaded_spinners']:.0f} processes "
                f"spinning on the CPU (load average {figures['pickup_loaded_load_average']:.1f}"
                f" at the end), p50/p95/p99 ms: {name}: "
                + "/".join(
                    _n(figures[f"pickup_loaded_from_commit_{p}"], 2)
                    for p in ("p50_ms", "p95_ms", "p99_ms")
                )
                + (
                    ""
                    if figures.get("pickup_loaded_round_trip_p99_ms") is None
                    else "; one SELECT 1 round trip meanwhile, p50/p99 ms: "
                    + "/".join(
                        _n(figures[f"pickup_loaded_round_trip_{p}"], 2)
                        for p in ("p50_ms", "p99_ms")
                    )
                )
            )
    for name, figures in systems.items():
        split = figures.get("e2e_cpu_ms_per_job")
        if split:
            parts = ", ".join(f"{part} {ms:.3f}" for part, ms in split.items())
            out.append(
                f"end to end, CPU per job by part (ms): {name}: {parts}; "
                f"total {sum(split.values()):.3f}"
            )
    out += features.lines(summary.get("features", {}))
    ours = systems.get(OURS, {})
    sweep = ours.get("drain_by_workers", {})
    if sweep:
        out += ["", f"{OURS} drain by WORKERS (jobs/s)"]
        out.append(
            _table(
                ["WORKERS", "1 process", "2 processes"],
                [
                    [w, _n(v.get("1proc_jobs_per_s")), _n(v.get("2proc_jobs_per_s"))]
                    for w, v in sorted(sweep.items(), key=lambda item: int(item[0]))
                ],
            )
        )
    single = ours.get("http_single")
    if single or "http_batch_jobs_per_s" in ours:
        out += ["", f"{OURS}-api, one process"]
        if single:
            out.append(
                f"  POST /jobs ({_n(single['concurrency'])} clients):"
                f" {_n(single['jobs_per_s'])} jobs/s, p50 {_n(single['p50_ms'], 2)} ms,"
                f" p99 {_n(single['p99_ms'], 2)} ms"
            )
        if "http_batch_jobs_per_s" in ours:
            out.append(
                f"  POST /jobs/batch (1,000 per request, {config['batch_concurrency']} clients): "
                f"{_n(ours['http_batch_jobs_per_s'])} jobs/s"
            )
    backlog = summary.get("backlog")
    if backlog and "difference_pct" in backlog:
        rows_ = []
        for key, label in (
            ("claim_p50_ms", f"claim({backlog['claim_n']}) p50 ms"),
            ("claim_p99_ms", f"claim({backlog['claim_n']}) p99 ms"),
            ("drain_jobs_per_s", f"drain of {backlog['drain_window']:,} jobs, jobs/s"),
        ):
            digits = 2 if key.endswith("ms") else 0
            rows_.append(
                [
                    label,
                    _n(backlog["empty"][key], digits),
                    _n(backlog["backlog"][key], digits),
                    f"{backlog['difference_pct'][key]:+.1f}%",
                ]
            )
        out += [
            "",
            f"Backlog: {backlog['rows']['completed']:,} completed + {backlog['rows']['pending']:,} "
            "pending rows vs an empty table"
            f" (within 20%: {'yes' if backlog['within_20pct'] else 'NO'})",
            _table(["", "empty table", "backlog", "difference"], rows_),
        ]
    out += scheduling.lines(summary.get("scheduling", {}))
    out += keys.lines(summary.get("keys", {}))
    out += costs.lines(summary.get("costs", {}))
    out += listing.lines(summary.get("listing", {}))
    out += waiting.lines(summary.get("waiting", {}))
    out += retention.lines(summary.get("retention", {}))
    out += client.lines(summary.get("client", {}))
    out += pressure_report.lines(summary.get("pressure", {}))
    hooks = summary.get("webhooks")
    if hooks:
        out += [
            "",
            f"Webhooks: {hooks['processes']} worker process x {hooks['workers']} slots, "
            "POST to a local sink answering 200",
            *webhooks.lines(hooks),
        ]
    prof = summary.get("profile")
    if prof:
        out += [
            "",
            f"Where our worker processes spend a drain (py-spy, {prof['samples']:,} samples)",
        ]
        out += [f"  {pct:5.1f}%  {area}" for area, pct in prof["areas_pct"].items()]
        out += ["  functions with the most samples of their own:"]
        out += [f"  {pct:5.1f}%  {name}" for name, pct in prof["top_self_pct"].items()]
    if document["errors"]:
        out += ["", "Steps that failed or could not run"]
        out += [f"  {e['step']}: {e['error']}" for e in document["errors"]]
    out += ["", "Targets", *targets_table(summary["targets"])]
    return "\n".join(out)


def _measured(target: dict[str, Any]) -> str:
    value = target["measured"]
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:+.1f}%" for k, v in value.items())
    if target.get("versus") is not None:
        return f"{value:,.0f} vs {target['versus']:,.0f}"
    if value == target.get("ratio"):
        return ""  # the ratio column shows it
    # Latencies to the hundredth of a millisecond (a p99 of 100.5 misses <= 100); rates and
    # counts whole.
    if not target["target"].endswith("ms)") and (isinstance(value, int) or abs(value) >= 100):
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def targets_table(targets: list[dict[str, Any]]) -> list[str]:
    """One line per target: verdict, target, goal, what was measured, the ratio if any."""
    rows = [
        [
            "MISSED" if t["status"] == "missed" else t["status"],
            t["target"],
            t["goal"],
            _measured(t),
            "" if t["ratio"] is None else f"{t['ratio']:.2f}x",
        ]
        for t in targets
    ]
    header = ["verdict", "target", "goal", "measured", "ratio"]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  "
        + "  ".join(
            cell.rjust(w) if i >= 3 else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, ["-" * w for w in widths], *rows]
    ]
