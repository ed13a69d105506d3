"""Backoff as documented (docs/worker.md, "Record"): uniform in [c/2, c],
c = min(base * 2^(n-1), cap); and the waits of `Retry`, built on it."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobcore.backoff import Retry, backoff


def ceiling(attempt: int, base: float, cap: float) -> float:
    return min(base * 2 ** (attempt - 1), cap)


@given(
    attempt=st.integers(1, 200),
    base=st.floats(0.001, 60),
    cap=st.floats(0.001, 3600),
    seed=st.integers(0, 2**32),
)
def test_delay_stays_within_half_ceiling_and_ceiling(attempt, base, cap, seed):
    delay = backoff(attempt, base, cap, random.Random(seed))
    c = ceiling(attempt, base, cap)
    assert c / 2 <= delay <= c


def test_delay_grows_exponentially_until_the_cap():
    highest = [
        max(backoff(n, 1.0, 300.0, random.Random(s)) for s in range(200)) for n in (1, 2, 3, 4)
    ]
    assert [round(h) for h in highest] == [1, 2, 4, 8]
    assert all(150 <= backoff(20, 1.0, 300.0, random.Random(s)) <= 300 for s in range(50))


def test_jitter_spreads_delays_across_the_whole_window():
    delays = [backoff(5, 1.0, 300.0, random.Random(s)) for s in range(500)]
    assert min(delays) < 8.5 and max(delays) > 15.5  # window is [8, 16]


def test_huge_attempt_numbers_do_not_overflow():
    assert 150 <= backoff(10_000, 1.0, 300.0) <= 300
    assert 150 <= backoff(10**12, 1e-300, 300.0) <= 300


def test_attempt_below_one_is_rejected():
    with pytest.raises(ValueError):
        backoff(0, 1.0, 2.0)


def test_retry_waits_grow_from_first_to_the_limit_and_start_over_after_a_success():
    retry = Retry(0.5, 4.0, random.Random(1))
    waits = [retry.failed() for _ in range(6)]
    ceilings = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert all(c / 2 <= w <= c for w, c in zip(waits, ceilings, strict=True))
    retry.succeeded()
    assert 0.25 <= retry.failed() <= 0.5


@pytest.mark.parametrize(("first", "limit"), [(0, 1), (-1, 1), (2, 1)])
def test_retry_refuses_waits_that_are_not_positive_and_ordered(first, limit):
    with pytest.raises(ValueError):
        Retry(first, limit)
