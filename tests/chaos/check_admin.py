"""The chaos checker's rules for the operator's actions (`tests.chaos.admin`): queue pauses
and bulk cancels and retries, held against the handlers' executions, the workers' writes
and the jobs' final rows.

- A pause: no attempt of the paused queue starts from PAUSE_LIMIT after the pause's 200
  answer (plus START_MARGIN, from a claim to its handler's start record) until its resume
  was sent. A worker process a fault of its own hit (paused, cut off or slowed on its way
  to the database) meanwhile is excepted, and counted: it may not have heard the pause.
- A job that ended cancelled, matched by a bulk cancel (and not cancelled one by one:
  `check_cancels` holds those to their answers), starts no attempt after it was cancelled
  (its `finished_at`), unless that attempt was claimed before and its holder hit by a
  fault, which delayed its start record (counted).
- No job had both a `cancelled` and a `completed` outcome applied.
- The jobs of the bulk-cancelled type that ended cancelled are at least as many as the bulk
  cancels' answers counted cancelled at once.

How the checker's other rules read these actions: a bulk cancel sent before a job finished
whose filter matches the job is the cancel it was asked (`check_cancels`); a bulk retry
naming a dead-lettered job explains its re-run after that (`checker`).
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from tests.chaos.admin import BULK_TYPE
from tests.chaos.evidence import (
    BulkAction,
    Disturbance,
    Execution,
    JobRow,
    QueuePause,
    Write,
    disturbed,
)

# The workers stop claiming from a paused queue within this long of the pause's answer.
PAUSE_LIMIT = 1.0
# From a claim's commit to its handler's start record, on a loaded machine.
START_MARGIN = 0.5
# The client's clock and the database's are the same machine's; a little rounding.
CLOCK_MARGIN = 0.001


def check_pauses(
    pauses: Sequence[QueuePause],
    finals: Mapping[str, JobRow],
    per_job: Mapping[str, list[Execution]],
    hits: Sequence[Disturbance],
    bad: list[str],
) -> dict[str, Any]:
    """The pause rule above; the pauses' summary."""
    in_grace = excepted = 0
    after_resume: list[float] = []
    for p in pauses:
        quiet_from = p.paused_at + PAUSE_LIMIT + START_MARGIN
        first_after: float | None = None
        for job_id, runs in per_job.items():
            row = finals.get(job_id)
            if row is None or row.queue != p.queue:
                continue
            for e in runs:
                if p.paused_sent_at <= e.start <= quiet_from:
                    in_grace += 1
                elif quiet_from < e.start < p.resume_sent_at:
                    if any(
                        d.pids is not None and d.hits(e.pid, p.paused_sent_at, e.start, job_id)
                        for d in hits
                    ):
                        excepted += 1
                        continue
                    bad.append(
                        f"queue {p.queue}: job {job_id} lease {e.lease_token} started "
                        f"{e.start - p.paused_at:.2f}s after the pause was answered, "
                        f"{p.resume_sent_at - e.start:.2f}s before the resume was sent"
                    )
                elif e.start >= p.resume_sent_at and (first_after is None or e.start < first_after):
                    first_after = e.start
        if first_after is not None:
            after_resume.append(first_after - p.resume_sent_at)
    return {
        "pauses": len(pauses),
        "paused_seconds": round(sum(p.resume_sent_at - p.paused_at for p in pauses), 1),
        "started_within_the_limit": in_grace,
        "started_by_disturbed_workers": excepted,
        "first_start_after_resume_seconds": _spread(after_resume),
    }


def check_bulk(
    actions: Sequence[BulkAction],
    finals: Mapping[str, JobRow],
    per_job: Mapping[str, list[Execution]],
    logged: Mapping[tuple[str, int], Write],
    hits: Sequence[Disturbance],
    lease: float,
    asked: Collection[str],
    bad: list[str],
) -> dict[str, Any]:
    """The cancel rules above; the bulk actions' summary. `asked`: the jobs cancelled one by
    one as well, whose starts after a cancel `check_cancels` judges."""
    stale = 0
    cancels = [a for a in actions if a.action == "cancel"]
    for job_id, row in finals.items():
        if row.status != "cancelled" or row.finished_at is None or job_id in asked:
            continue
        if not any(a.matches(job_id, row.type, row.queue) for a in cancels):
            continue
        for e in per_job.get(job_id, []):
            if e.start <= row.finished_at + CLOCK_MARGIN:
                continue
            if disturbed(hits, e.pid, row.finished_at - lease, e.start, job_id):
                stale += 1
                continue
            bad.append(
                f"job {job_id}: lease {e.lease_token} started "
                f"{e.start - row.finished_at:.2f}s after the job was cancelled"
            )
    outcomes: dict[str, set[str]] = {}
    for w in logged.values():
        if w.applied and w.outcome is not None:
            outcomes.setdefault(w.job_id, set()).add(w.outcome)
    for job_id, seen in sorted(outcomes.items()):
        if {"cancelled", "completed"} <= seen:
            bad.append(f"job {job_id} was both cancelled and completed")
    answered = [a for a in actions if a.status_code == 200]
    cancels = [a for a in answered if a.action == "cancel"]
    retries = [a for a in answered if a.action == "retry"]
    at_once = sum(int(a.answer.get("cancelled", 0)) for a in cancels)
    ended = sum(r.type == BULK_TYPE and r.status == "cancelled" for r in finals.values())
    if ended < at_once:
        bad.append(
            f"bulk cancels answered {at_once} jobs cancelled, but only {ended} jobs of "
            f"{BULK_TYPE} ended cancelled"
        )
    return {
        "cancel_requests": sum(a.action == "cancel" for a in actions),
        "cancelled_at_once": at_once,
        "cancel_requested": sum(int(a.answer.get("cancel_requested", 0)) for a in cancels),
        "bulk_type_jobs": sum(r.type == BULK_TYPE for r in finals.values()),
        "bulk_type_ended_cancelled": ended,
        "retry_requests": sum(a.action == "retry" for a in actions),
        "retried": sum(int(a.answer.get("retried", 0)) for a in retries),
        "stale_starts_after_cancel": stale,
    }


def retries_of(actions: Sequence[BulkAction]) -> dict[str, list[float]]:
    """When a bulk retry naming each job was sent, earliest first."""
    found: dict[str, list[float]] = {}
    for a in sorted(actions, key=lambda a: a.sent_at):
        if a.action == "retry":
            for job_id in a.filter.get("ids", ()):
                found.setdefault(job_id, []).append(a.sent_at)
    return found


def _spread(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"p50": round(statistics.median(values), 3), "max": round(max(values), 3)}
