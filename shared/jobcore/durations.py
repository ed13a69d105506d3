"""Durations as users write them: Go-style strings (`500ms`, `1.5s`, `1m30s`) or seconds."""

from __future__ import annotations

import math
import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(value: object) -> float:
    """Seconds in a Go-style duration (`1m30s`, `500ms`, `1.5s`) or a plain number."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 500ms, 2s or 1m30s")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = str(value).strip()
        try:
            seconds = float(text)
        except ValueError:
            if not text or _PART.sub("", text) != "":
                raise ValueError(
                    f"{text!r} is not a duration (examples: 500ms, 2s, 1m30s)"
                ) from None
            seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{value!r} is not a non-negative duration")
    return seconds


def format_duration(seconds: float) -> str:
    """`86400.0` -> `24h`, `300.0` -> `5m`, `1.5` -> `1.5s`: how limits are shown."""
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
