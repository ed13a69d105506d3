"""The chaos client's routed mix: valid requests, and due times that never run ahead of
what the API will store."""

from __future__ import annotations

import random
import time
from collections import Counter

from jobqueue_api.validation import new_job
from tests.chaos import load
from tests.chaos.canceller import plan
from tests.chaos.system import LEASE_SECONDS, QUEUES

TYPES = ["chaos-fast", "chaos-slow", "chaos-flaky", "chaos-permanent", "chaos-long", "chaos-bulk"]


def test_the_mix_spans_every_queue_priorities_and_both_ways_of_scheduling() -> None:
    rng = random.Random(7)
    routed = [load.route(load.job_body("fast", rng), rng) for _ in range(2000)]
    queues = Counter(body["queue"] for body, _ in routed)
    assert set(queues) == {name for name, _ in load.QUEUE_MIX}
    assert sum("priority" in body for body, _ in routed) > 1000
    ways = Counter((s[0], s[2]) for _, s in routed if s is not None)
    assert set(ways) == {("delay", True), ("delay", False)} | {
        ("run_at", offset) for offset in load.OFFSETS
    }


def test_every_queue_of_the_mix_is_served_by_the_chaos_workers() -> None:
    served = {item.partition(":")[0] for item in QUEUES.split(",")}
    assert {name for name, _ in load.QUEUE_MIX} <= served


def test_scheduled_bodies_are_valid_and_due_no_earlier_than_the_client_assumes() -> None:
    rng = random.Random(11)
    now = time.time()
    checked = Counter()
    for kind, _ in load.MIX:
        for _ in range(200):
            body, schedule = load.route(load.job_body(kind, rng), rng)
            sent, earliest = load.scheduled(body, schedule, now)
            job = new_job(sent, known_types=TYPES, default_max_attempts=5)
            if schedule is None:
                assert earliest == now and job.run_at is None and job.delay is None
            elif schedule[0] == "run_at":
                assert job.run_at is not None
                assert abs(job.run_at.timestamp() - earliest) < 1e-6
                assert earliest - now >= load.SCHEDULE_AHEAD[0] - 0.001
            else:
                assert job.delay is not None
                # The database adds the delay to its now(), which is later than `now`.
                assert abs(now + job.delay - earliest) < 1e-6
            checked[schedule[0] if schedule else None] += 1
    assert checked["run_at"] and checked["delay"] and checked[None]


def test_long_jobs_outlive_the_lease_two_to_three_times_under_a_timeout_of_their_own() -> None:
    rng = random.Random(5)
    for _ in range(200):
        body = load.job_body("long", rng)
        job = new_job(body, known_types=TYPES, default_max_attempts=5)
        seconds = body["payload"]["seconds"]
        assert 2 * LEASE_SECONDS <= seconds <= 3 * LEASE_SECONDS
        assert job.timeout is not None and job.timeout >= seconds + LEASE_SECONDS


def test_one_job_in_twenty_is_cancelled_pending_racing_or_running_not_the_first_long() -> None:
    rng, cancel_rng = random.Random(3), random.Random(4)
    kinds = [k for k, _ in load.MIX]
    weights = [w for _, w in load.MIX]
    made: Counter[str] = Counter()
    plans = []
    for _ in range(20000):
        kind = rng.choices(kinds, weights)[0]
        body, schedule = load.route(load.job_body(kind, rng), rng)
        plans.append(
            (kind, made[kind], plan(kind, body, schedule is not None, cancel_rng, made[kind]))
        )
        made[kind] += 1
    chosen = [p for _, _, p in plans if p is not None]
    assert 0.03 < len(chosen) / len(plans) < 0.07
    assert {mode for mode, _ in chosen} == {"pending", "race", "running"}
    long_plans = [p for kind, _, p in plans if kind == "long"]
    assert [p is not None for p in long_plans] == [i % 3 == 1 for i in range(len(long_plans))]
    # A running job is asked a moment into its attempt, well before it would end.
    for kind, _, p in plans:
        if p is not None and p[0] == "running" and kind == "long":
            assert 0 < p[1] < load.LONG_SECONDS[0] / 2
