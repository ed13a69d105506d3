"""The figures load tests measure: collected here, printed and saved by `conftest.py`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

FIGURES: dict[str, Any] = {}


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_ms(seconds: Sequence[float]) -> dict[str, float]:
    return {f"p{p}_ms": round(percentile(seconds, p) * 1000, 2) for p in (50, 90, 99)} | {
        "max_ms": round(max(seconds) * 1000, 2)
    }


def summary_lines(figures: dict[str, Any]) -> list[str]:
    lines = []
    if "api_load" in figures:
        f = figures["api_load"]
        lat = f["latency"]
        lines += [
            f"API load: {f['clients']} clients for {f['seconds']} s, {f['requests']} requests "
            f"({f['requests_per_second']}/s), statuses {f['statuses']}, client errors "
            f"{f['client_errors']}, /readyz {f['readyz']}",
            f"  latency p50 {lat['p50_ms']} ms, p90 {lat['p90_ms']} ms, p99 {lat['p99_ms']} ms, "
            f"max {lat['max_ms']} ms",
            f"  jobs: {f['jobs_submitted_per_second']}/s submitted, "
            f"{f['jobs_completed_per_second_under_load']}/s completed under load; "
            f"{f['jobs_pending_at_end_of_load']} left when the load stopped, "
            f"drained in {f['drain_seconds']} s",
        ]
    if "backlog_claim" in figures:
        f = figures["backlog_claim"]
        lines.append(f"claim(n={f['n']}) latency over {f['samples']} claims:")
        for level, lat in f["pending"].items():
            lines.append(
                f"  {int(level):>7,} pending: p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms"
            )
    return lines
