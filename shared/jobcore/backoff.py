"""Waits after failures: a job's retry delay (`backoff`), and the waits between tries of
an action that keeps failing (`Retry`). Capped exponential growth with jitter."""

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


class Retry:
    """The waits between tries of an action that keeps failing (a reconnect, a write, a
    claim during an outage): `backoff()` of the number of failures in a row, from `first`
    seconds up to `limit`; a success starts over."""

    def __init__(self, first: float, limit: float, rng: random.Random | None = None) -> None:
        if not 0 < first <= limit:
            raise ValueError(f"need 0 < first <= limit, got first={first}, limit={limit}")
        self.first = first
        self.limit = limit
        self.failures = 0
        self._rng = rng

    def failed(self) -> float:
        """Count a failure; returns the seconds to wait before the next try."""
        self.failures += 1
        return backoff(self.failures, self.first, self.limit, self._rng)

    def succeeded(self) -> None:
        self.failures = 0
