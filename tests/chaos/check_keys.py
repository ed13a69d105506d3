"""The chaos checker's rules for concurrency limits: at no instant did more than the
workers' KEY_CONCURRENCY limit of attempts of one (queue, key) run, nor more than a type's
TYPE_CONCURRENCY limit of attempts of that type.

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
    """The rule for keys; the keyed jobs' summary (most running at once, per queue/key)."""
    keyed = {a.job_id: (a.queue, a.concurrency_key) for a in acks if a.concurrency_key}
    groups: dict[str, list[Execution]] = defaultdict(list)
    labels: dict[str, str] = {}
    for job_id, (queue, key) in keyed.items():
        name = f"key {key} of queue {queue}"
        groups[name] += per_job.get(job_id, [])
        labels[name] = f"{queue}/{key}"
    most = _most_at_once(groups, {name: limit for name in groups}, logged, hits, lease, bad)
    return {
        "limit": limit,
        "keyed_jobs": len(keyed),
        "keyed_attempts": sum(len(runs) for runs in groups.values()),
        "max_running": max(most.values(), default=0),
        "max_running_by_key": dict(sorted((labels[name], n) for name, n in most.items())),
    }


def check_type_concurrency(
    per_job: Mapping[str, list[Execution]],
    logged: Mapping[tuple[str, int], Write],
    hits: Sequence[Disturbance],
    lease: float,
    limits: Mapping[str, int],
    bad: list[str],
) -> dict[str, Any]:
    """The rule for types; per limited type, its limit, attempts and most running at once."""
    groups: dict[str, list[Execution]] = {f"type {name}": [] for name in limits}
    for runs in per_job.values():
        for e in runs:
            if e.type in limits:
                groups[f"type {e.type}"].append(e)
    most = _most_at_once(
        groups, {f"type {name}": n for name, n in limits.items()}, logged, hits, lease, bad
    )
    return {
        name: {
            "limit": n,
            "attempts": len(groups[f"type {name}"]),
            "max_running": most[f"type {name}"],
        }
        for name, n in sorted(limits.items())
    }


def _most_at_once(
    groups: Mapping[str, list[Execution]],
    limits: Mapping[str, int],
    logged: Mapping[tuple[str, int], Write],
    hits: Sequence[Disturbance],
    lease: float,
    bad: list[str],
) -> Counter[str]:
    """Per group of attempts, the most that ran at once (see the module docstring); each
    excess over the group's limit is a violation."""
    most: Counter[str] = Counter()
    for name, executions in sorted(groups.items()):
        limit = limits[name]
        runs = []
        for e in executions:
            end = attempt_end(e, logged)
            until = lease_valid_until(e, end, hits, lease)
            if until == float("inf"):
                # Neither ended nor disturbed (the run stopped first): its first lease, surely.
                until = e.start + lease - lease / RENEWALS_PER_LEASE
            runs.append((e.start, until, e.job_id, e.lease_token))
        # Ends sort before starts at the same instant: a unit handed on is not an excess.
        events = sorted(
            [(start, 1, job, token) for start, _, job, token in runs]
            + [(until, -1, job, token) for _, until, job, token in runs]
        )
        running: dict[tuple[str, int], float] = {}
        reported = 0
        most[name] = 0
        for at, step, job, token in events:
            if step < 0:
                running.pop((job, token), None)
                continue
            running[(job, token)] = at
            most[name] = max(most[name], len(running))
            if len(running) > limit:
                reported += 1
                if reported <= REPORTED:
                    held = ", ".join(f"{j} lease {t}" for j, t in sorted(running))
                    bad.append(
                        f"{name}: {len(running)} attempts ran at once (limit {limit}): {held}"
                    )
        if reported > REPORTED:
            bad.append(f"{name}: {reported - REPORTED} more excesses")
    return most
