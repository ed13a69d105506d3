"""The chaos checker's accounting of retention: which acknowledged jobs may be missing from
the final table.

Retention runs during the faults, so a job that finished early in the run may be gone by
the end. A trigger in the run's database (`tests.chaos.audit`) copies every row deleted
from `jobs`, in the deleting statement itself, with that statement's now() and the
session's application_name; a delete that did not commit leaves no copy. A missing
acknowledged job is accounted for only by such a copy, and the copy must show a
legitimate prune:

- the job was finished (completed, failed, cancelled or dead_letter) when deleted;
  a deleted job that was not is lost;
- its status's retention is on, and it had finished at least that long before the
  deleting statement (`finished_at` older than now() less the retention, both read on the
  database's clock);
- a worker deleted it (application_name `jobqueue-worker`).

The copied row then stands for the job's final row in every other check (its final
lease's execution, its attempts). The workers' own count of deleted jobs (their `jobs
pruned` lines) may fall short of the copies (a worker killed between a delete and its
line), never exceed them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from tests.chaos.evidence import Pruned

# Statuses a job can be deleted in; retention for `cancelled` is RETENTION_FAILED's.
FINISHED = ("completed", "failed", "cancelled", "dead_letter")
PRUNED_BY = "jobqueue-worker"
# finished_at and the deleting statement's now() are the same clock, as microseconds.
CLOCK_MARGIN = 1e-5


def check_pruned(
    pruned: Sequence[Pruned],
    retention: Mapping[str, float],
    logged: int,
    bad: list[str],
    faults_until: float | None = None,
) -> dict[str, Any]:
    """Every deleted row against the rules above; the summary of what retention did
    (`faults_until`: when the last fault was removed, to count the deletions before)."""
    seen: Counter[str] = Counter()
    for p in pruned:
        job = p.row
        seen[job.id] += 1
        if job.status not in FINISHED:
            bad.append(f"job {job.id} was deleted while {job.status}, by {p.pruned_by}")
            continue
        if p.pruned_by.partition("/")[0] != PRUNED_BY:  # any release's: `<role>/<revision>`
            bad.append(f"job {job.id} ({job.status}) was deleted by {p.pruned_by!r}, not a worker")
        age = retention.get(job.status, 0.0)
        if age <= 0:
            bad.append(f"job {job.id} was deleted {job.status} though that status is kept")
        elif job.finished_at is None:
            bad.append(f"job {job.id} was deleted {job.status} with no finished_at")
        elif p.pruned_at - job.finished_at < age - CLOCK_MARGIN:
            bad.append(
                f"job {job.id} was deleted {p.pruned_at - job.finished_at:.3f}s after it "
                f"finished {job.status}, before its retention of {age:g}s"
            )
    for job_id, n in seen.items():
        if n > 1:
            bad.append(f"job {job_id} was deleted {n} times")
    if logged > len(pruned):
        bad.append(f"the workers logged {logged} jobs pruned, but {len(pruned)} were deleted")
    until = faults_until if faults_until is not None else float("-inf")
    return {
        "pruned": len(pruned),
        "by_status": dict(sorted(Counter(p.row.status for p in pruned).items())),
        "logged": logged,
        # Each deleting statement has its own now(): how many statements deleted jobs.
        "statements": len({p.pruned_at for p in pruned}),
        "during_faults": sum(p.pruned_at <= until for p in pruned),
    }


def accounted_as_pruned(job_id: str, pruned: Mapping[str, Pruned]) -> bool:
    """Whether an acknowledged job missing from the table left its finished row behind when
    it was deleted (the age and deleter are judged by `check_pruned`)."""
    p = pruned.get(job_id)
    return p is not None and p.row.status in FINISHED
