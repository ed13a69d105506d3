"""The chaos checker's rules for the operator's actions (`tests.chaos.admin`): queue pauses,
held against the handlers' executions.

- A pause: no attempt of the paused queue starts from PAUSE_LIMIT after the pause's 200
  answer (plus START_MARGIN, from a claim to its handler's start record) until its resume
  was sent. A worker process a fault of its own hit (paused, cut off or slowed on its way
  to the database) meanwhile is excepted, and counted: it may not have heard the pause.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from tests.chaos.evidence import (
    Disturbance,
    Execution,
    JobRow,
    QueuePause,
)

# The workers stop claiming from a paused queue within this long of the pause's answer.
PAUSE_LIMIT = 1.0
# From a claim's commit to its handler's start record, on a loaded machine.
START_MARGIN = 0.5


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


def _spread(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"p50": round(statistics.median(values), 3), "max": round(max(values), 3)}
