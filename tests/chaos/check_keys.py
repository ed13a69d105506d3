"""The chaos checker's rule for concurrency keys: at no instant did more than the workers'
KEY_CONCURRENCY limit of attempts of one (queue, key) run.

An attempt counts as running from its handler's start record (its claim came just
before) until it stopped holding its job: its end record, or the worker's abandonment of
it, whichever came first. A holder a fault disturbed (killed, paused, cut off from the
database) counts only until its lease surely ran (`lease_valid_until`, as for the "no
lease run twice" rule): past that, recovery may rightly give its key's unit to another
claim. Start records come after the claims and end records before the outcome writes, so
the database counted each attempt at least this long: any excess is the claims'.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from jobqueue_worker.heartbeat import RENEWALS_PER_LEASE
from tests.chaos.evidence import (
    Ack,
    Disturbance,
    Execution,
    Write,
    attempt_end,
    lease_valid_until,
)

# How many excesses of one (queue, key) are reported one by one.
REPORTED = 5


def check_key_concurrency(
    acks: Sequence[Ack],
    per_job: Mapping[str, list[Execution]],
    logged: Mapping[tuple[str, int], Write],
    hits: Sequence[Disturbance],
    lease: float,
    limit: int,
    bad: list[str],
) -> dict[str, Any]:
    """The rule above; the keyed jobs' summary (most running at once, per queue/key)."""
    keyed = {a.job_id: (a.queue, a.concurrency_key) for a in acks if a.concurrency_key}
    spans: dict[tuple[str, str], list[tuple[float, float, str, int]]] = defaultdict(list)
    for job_id, (queue, key) in keyed.items():
        assert key is not None
        for e in per_job.get(job_id, []):
            end = attempt_end(e, logged)
            until = lease_valid_until(e, end, hits, lease)
            if until == float("inf"):
                # Neither ended nor disturbed (the run stopped first): its first lease, surely.
                until = e.start + lease - lease / RENEWALS_PER_LEASE
            spans[(queue, key)].append((e.start, until, e.job_id, e.lease_token))
    most: Counter[str] = Counter()
    for (queue, key), runs in sorted(spans.items()):
        # Ends sort before starts at the same instant: a unit handed on is not an excess.
        events = sorted(
            [(start, 1, job, token) for start, _, job, token in runs]
            + [(until, -1, job, token) for _, until, job, token in runs]
        )
        running: dict[tuple[str, int], float] = {}
        reported = 0
        for at, step, job, token in events:
            if step < 0:
                running.pop((job, token), None)
                continue
            running[(job, token)] = at
            name = f"{queue}/{key}"
            most[name] = max(most[name], len(running))
            if len(running) > limit:
                reported += 1
                if reported <= REPORTED:
                    held = ", ".join(f"{j} lease {t}" for j, t in sorted(running))
                    bad.append(
                        f"key {key} of queue {queue}: {len(running)} attempts ran at once "
                        f"(limit {limit}): {held}"
                    )
        if reported > REPORTED:
            bad.append(f"key {key} of queue {queue}: {reported - REPORTED} more excesses")
    return {
        "limit": limit,
        "keyed_jobs": len(keyed),
        "keyed_attempts": sum(len(runs) for runs in spans.values()),
        "max_running": max(most.values(), default=0),
        "max_running_by_key": dict(sorted(most.items())),
    }
