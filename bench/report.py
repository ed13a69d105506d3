"""From raw results to medians, ratios and target verdicts (`summarize`), and the text table."""

from __future__ import annotations

from typing import Any

from bench import client, costs, listing, retention, scheduling, waiting, webhooks
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
    for origin, p in PICKUP:
        figures[f"pickup_{origin}_{p}"] = _med(
            [r["pickup"][origin] for r in sessions if "pickup" in r], p
        )
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
            if peer == OURS:
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


def _targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    ours = summary["systems"].get(OURS, {})
    ratios = summary["ratios"]
    checks = [
        (
            "drain 2 procs vs PgQueuer",
            ">= 2x",
            ratios.get("pgqueuer", {}).get("drain_2proc"),
            2.0,
            True,
        ),
        (
            "drain 2 procs vs Procrastinate",
            ">= 10x",
            ratios.get("procrastinate", {}).get("drain_2proc"),
            10.0,
            True,
        ),
        (
            "idle pickup p50 from commit (ms)",
            "<= 1.5",
            ours.get("pickup_from_commit_p50_ms"),
            1.5,
            False,
        ),
        (
            "idle pickup p99 from commit (ms)",
            "<= 5",
            ours.get("pickup_from_commit_p99_ms"),
            5.0,
            False,
        ),
        (
            "bulk submit via POST /jobs/batch (jobs/s)",
            ">= 40000",
            ours.get("http_batch_jobs_per_s"),
            40_000,
            True,
        ),
    ]
    out = []
    for name, goal, value, bound, higher in checks:
        if value is None:
            continue
        met = value >= bound if higher else value <= bound
        out.append({"target": name, "goal": goal, "measured": value, "met": met})
    hooks = summary.get("webhooks")
    if hooks:
        out.append(
            {
                "target": "webhooks to a local sink, per worker process (jobs/s)",
                "goal": f">= {webhooks.TARGET_PER_PROCESS:.0f}, no retries",
                "measured": hooks["jobs_per_s_per_process"],
                "met": hooks["target_met"],
            }
        )
    out += scheduling.targets(summary.get("scheduling", {}))
    out += costs.targets(summary.get("costs", {}))
    out += listing.targets(summary.get("listing", {}))
    out += waiting.targets(summary.get("waiting", {}))
    out += retention.targets(summary.get("retention", {}))
    out += client.targets(summary.get("client", {}))
    backlog = summary.get("backlog", {})
    if "within_20pct" in backlog:
        out.append(
            {
                "target": "backlog within 20% of empty table",
                "goal": "claim p50/p99 and drain",
                "measured": backlog["difference_pct"],
                "met": backlog["within_20pct"],
            }
        )
    return out


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
    out += costs.lines(summary.get("costs", {}))
    out += listing.lines(summary.get("listing", {}))
    out += waiting.lines(summary.get("waiting", {}))
    out += retention.lines(summary.get("retention", {}))
    out += client.lines(summary.get("client", {}))
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
    if summary["targets"]:
        out += ["", "Targets"]
        for t in summary["targets"]:
            measured = t["measured"]
            shown = (
                ", ".join(f"{k} {v:+.1f}%" for k, v in measured.items())
                if isinstance(measured, dict)
                else _n(measured, 2)
            )
            out.append(f"  [{'met' if t['met'] else 'MISSED'}] {t['target']} {t['goal']}: {shown}")
    if document["errors"]:
        out += ["", "Steps that failed or could not run"]
        out += [f"  {e['step']}: {e['error']}" for e in document["errors"]]
    return "\n".join(out)
