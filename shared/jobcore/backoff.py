"""Retry delay after a retryable failure: capped exponential growth with jitter."""

from __future__ import annotations

import random

# 2.0 ** 1024 raises OverflowError; any base worth using reaches the cap long before.
_MAX_EXPONENT = 1000


def backoff(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt `attempt` (1-based).

    Uniform in [c/2, c] with c = min(base * 2**(attempt-1), cap).
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    ceiling = min(base * 2.0 ** min(attempt - 1, _MAX_EXPONENT), cap)
    return (rng or random).uniform(ceiling / 2, ceiling)
