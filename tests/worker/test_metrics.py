"""The worker's job metrics: counted per turn of the event loop, with the totals and
histogram one observation at a time would give."""

from __future__ import annotations

import asyncio
import random

from prometheus_client import REGISTRY, CollectorRegistry, Histogram

from jobcore.states import Operation
from jobqueue_worker import metrics


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_observing_many_at_once_gives_the_histogram_of_observing_each():
    registry = CollectorRegistry()
    buckets = (0.005, 0.01, 0.025, 0.05, 0.1, 1, 10)
    one = Histogram("one_by_one", "", buckets=buckets, registry=registry)
    many = Histogram("all_at_once", "", buckets=buckets, registry=registry)
    rng = random.Random(7)
    # Values on the bucket bounds too: a bound belongs to its own bucket (le).
    values = [
        rng.choice([0.0, 0.005, 0.01, 0.3, 10.0, 50.0, rng.uniform(0, 12)]) for _ in range(500)
    ]
    for value in values:
        one.observe(value)
    metrics.observe_many(many, values)
    got = {
        (s.name.replace("all_at_once", "h"), tuple(s.labels.items())): s.value
        for s in many.collect()[0].samples
        if not s.name.endswith("_created")
    }
    want = {
        (s.name.replace("one_by_one", "h"), tuple(s.labels.items())): s.value
        for s in one.collect()[0].samples
        if not s.name.endswith("_created")
    }
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) < 1e-9, key


async def test_attempts_are_counted_by_the_end_of_the_loop_turn():
    completed = _sample("jobs_completed_total")
    dead = _sample("jobs_failed_total", status="dead_letter")
    retried = _sample("jobs_retried_total")
    observed = _sample("job_processing_duration_seconds_count", outcome="completed")
    for _ in range(3):
        metrics.attempt_finished(Operation.COMPLETE, True, 0.002)
    metrics.attempt_finished(Operation.COMPLETE, False, 0.002)  # lost lease: timed, not counted
    metrics.attempt_finished(Operation.DEAD_LETTER, True, 0.5)
    metrics.attempt_finished(Operation.RETRY_LATER, True, 0.1)
    await asyncio.sleep(0)
    assert _sample("jobs_completed_total") == completed + 3
    assert _sample("jobs_failed_total", status="dead_letter") == dead + 1
    assert _sample("jobs_retried_total") == retried + 1
    assert _sample("job_processing_duration_seconds_count", outcome="completed") == observed + 4


def test_without_an_event_loop_an_attempt_is_counted_at_once():
    completed = _sample("jobs_completed_total")
    metrics.attempt_finished(Operation.COMPLETE, True, 0.001)
    assert _sample("jobs_completed_total") == completed + 1
