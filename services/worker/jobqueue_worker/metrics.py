"""The worker's job metrics (SPEC §8), written by child processes.

With PROMETHEUS_MULTIPROC_DIR set (the supervisor sets it before starting any
child), every child writes its values to files there and the supervisor's
`/metrics` sums them, so the totals survive a child's restart.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

# Outcomes of an attempt, as they appear in logs and in the histogram's `outcome` label.
OUTCOMES = {
    "complete": "completed",
    "fail": "failed",
    "dead_letter": "dead_letter",
    "retry_later": "retried",
    "release": "released",
}

JOBS_COMPLETED = Counter("jobs_completed_total", "Jobs completed (outcome recorded).")
JOBS_FAILED = Counter(
    "jobs_failed_total",
    "Jobs that ended failed (permanent error) or dead_letter (attempts exhausted).",
    ["status"],
)
JOBS_RETRIED = Counter("jobs_retried_total", "Attempts that failed and were scheduled again.")
JOBS_RECOVERED = Counter(
    "jobs_recovered_total", "Jobs whose lease expired, put back to pending or dead_letter."
)
JOB_DURATION = Histogram(
    "job_processing_duration_seconds",
    "Time a handler ran, by the attempt's outcome.",
    ["outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)


def initialise() -> None:
    """Create every labelled series at zero, so dashboards see them before the first job."""
    for status in ("failed", "dead_letter"):
        JOBS_FAILED.labels(status=status)
    for outcome in OUTCOMES.values():
        JOB_DURATION.labels(outcome=outcome)


def attempt_finished(kind: str, applied: bool, duration: float) -> None:
    """Count an attempt whose outcome `kind` was written (`applied`) or found lost."""
    JOB_DURATION.labels(outcome=OUTCOMES[kind]).observe(duration)
    if not applied:
        return
    if kind == "complete":
        JOBS_COMPLETED.inc()
    elif kind in ("fail", "dead_letter"):
        JOBS_FAILED.labels(status="failed" if kind == "fail" else "dead_letter").inc()
    elif kind == "retry_later":
        JOBS_RETRIED.inc()


def jobs_recovered(dead_lettered: int, total: int) -> None:
    JOBS_RECOVERED.inc(total)
    if dead_lettered:
        JOBS_FAILED.labels(status="dead_letter").inc(dead_lettered)
