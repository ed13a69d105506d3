"""Retry delay after a retryable failure: capped exponential growth with jitter."""

from __future__ import annotations

import math
import random


def backoff(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt `attempt` (1-based).

    Uniform in [c/2, c] with c = min(base * 2**(attempt-1), cap). The cap is
    detected by comparing exponents, so no attempt number can overflow.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    if base <= 0 or cap <= base:
        ceiling = max(min(base, cap), 0.0)
    elif attempt - 1 >= math.log2(cap / base):
        ceiling = cap
    else:
        ceiling = base * 2.0 ** min(attempt - 1, 1023)
    return (rng or random).uniform(ceiling / 2, ceiling)
