"""Summaries of measured samples: percentiles, medians, ratios."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no samples")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99 and mean of latencies given in seconds, reported in milliseconds."""
    return {
        "p50_ms": percentile(seconds, 50) * 1000,
        "p95_ms": percentile(seconds, 95) * 1000,
        "p99_ms": percentile(seconds, 99) * 1000,
        "mean_ms": statistics.fmean(seconds) * 1000,
        "samples": len(seconds),
    }


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def merge(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    """The median of each figure across repeated runs (keys present in every run)."""
    keys = set(runs[0]).intersection(*runs[1:]) if runs else set()
    return {key: median([run[key] for run in runs]) for key in sorted(keys)}


def ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs else math.inf
