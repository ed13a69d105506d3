"""The worker's job metrics (docs/operations.md, "Metrics"), written by child processes.

With PROMETHEUS_MULTIPROC_DIR set (the supervisor sets it before starting any
child), every child writes its values to files there and the supervisor's
`/metrics` sums them, so the totals survive a child's restart.

Each update there is a locked write to a memory-mapped file, so the attempts
finished in one turn of the event loop (the completer records a whole batch at
once) are counted together when the turn ends: one write per series touched,
not two or three per job.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Collection, Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from jobcore.search import DEPTH_STATUSES, QueueDepth
from jobcore.states import ATTEMPT_OUTCOMES, FINISHED, Operation, Status


class _Series:
    """The metric objects. Made on first use, in the process that writes them: with
    PROMETHEUS_MULTIPROC_DIR set, making one opens that process's metric file, which the
    fork server the worker processes come from (jobqueue_worker.launch) must not do."""

    def __init__(self) -> None:
        self.JOBS_COMPLETED = Counter("jobs_completed_total", "Jobs completed (outcome recorded).")
        self.JOBS_FAILED = Counter(
            "jobs_failed_total",
            "Jobs that ended failed (permanent error) or dead_letter (attempts exhausted).",
            ["status"],
        )
        self.JOBS_RETRIED = Counter(
            "jobs_retried_total", "Attempts that failed and were scheduled again."
        )
        self.JOBS_SNOOZED = Counter(
            "jobs_snoozed_total", "Attempts whose handler snoozed the job (attempt given back)."
        )
        self.JOBS_CANCELLED = Counter(
            "jobs_cancelled_total",
            "Running jobs that ended cancelled: their attempt was stopped on a cancel request, or"
            " their lease expired after one.",
        )
        self.JOBS_LEASE_LOST = Counter(
            "jobs_lease_lost_total",
            "Leases found lost: by a heartbeat (the attempt was stopped, nothing written) or by an"
            " outcome write (rejected by the fence).",
        )
        self.JOBS_RECOVERED = Counter(
            "jobs_recovered_total",
            "Jobs whose lease expired, put back to pending or dead_letter (cancelled when a cancel"
            " was requested).",
        )
        self.JOBS_UNHANDLED = Counter(
            "jobs_unhandled_total",
            "Claimed jobs given back (attempt not spent) because the worker has no handler for"
            " their type, by type.",
            ["type"],
        )
        self.JOB_DURATION = Histogram(
            "job_processing_duration_seconds",
            "Time a handler ran, by the attempt's outcome.",
            ["outcome"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )
        self.NOTIFICATIONS_UNHEARD = Counter(
            "jobs_notifications_unheard_total",
            "Notification checks whose notification the worker's listener did not hear in time"
            " (wake-ups and cancels then wait for the poll and the heartbeat).",
        )
        self.JOBS_PRUNED = Counter(
            "jobs_pruned_total", "Finished jobs deleted by retention, by their status.", ["status"]
        )
        self.JOBS_MOVED = Counter(
            "jobs_moved_total", "Completed jobs moved from jobs to jobs_history."
        )
        # "mostrecent": the supervisor shows the time a child set last, kept after that child
        # exits; a series no child has set yet (timestamp 0) is left out, so the gauge is absent
        # until the first complete run and where retention is off (the alert on a stalled
        # retention needs both).
        self.RETENTION_LAST_RUN = Gauge(
            "jobs_retention_last_run_timestamp_seconds",
            "Unix time at which a retention run last went through every status it prunes.",
            multiprocess_mode="mostrecent",
        )
        # The queue gauges: set only by the worker process leading them
        # (jobqueue_worker.maintenance). "livemostrecent": the supervisor's /metrics shows, per
        # series, the value its children set last, and forgets a child's values when it exits.
        self.JOBS_QUEUED = Gauge(
            "jobs_queued",
            "Jobs of a queue by status (pending: due; scheduled: pending, not due yet), exported by"
            " the one worker process that leads the queue gauges.",
            ["queue", "status"],
            multiprocess_mode="livemostrecent",
        )
        self.JOBS_QUEUE_PAUSED = Gauge(
            "jobs_queue_paused",
            "1 while the queue is paused (no worker claims from it), else 0; exported by the one"
            " worker process that leads the queue gauges.",
            ["queue"],
            multiprocess_mode="livemostrecent",
        )
        self.JOBS_OLDEST_PENDING_AGE = Gauge(
            "jobs_oldest_pending_age_seconds",
            "Seconds since the oldest due pending job of a queue became due (0: none), exported by"
            " the one worker process that leads the queue gauges.",
            ["queue"],
            multiprocess_mode="livemostrecent",
        )


_made: _Series | None = None


def _series() -> _Series:
    global _made
    if _made is None:
        _made = _Series()
    return _made


# The counter each applied outcome adds to; a release counts nowhere (the attempt was given
# back). Filled by initialise(), in the process that writes the values.
_COUNTED: dict[Operation, Any] = {}


def initialise() -> None:
    """Create every labelled series at zero, so dashboards see them before the first job."""
    _COUNTED.update(
        {
            Operation.COMPLETE: _series().JOBS_COMPLETED,
            Operation.FAIL: _series().JOBS_FAILED.labels(status=Status.FAILED),
            Operation.DEAD_LETTER: _series().JOBS_FAILED.labels(status=Status.DEAD_LETTER),
            Operation.RETRY_LATER: _series().JOBS_RETRIED,
            Operation.SNOOZE: _series().JOBS_SNOOZED,
            Operation.CANCEL_ATTEMPT: _series().JOBS_CANCELLED,
        }
    )
    for op in ATTEMPT_OUTCOMES:
        _series().JOB_DURATION.labels(outcome=op.outcome)
    for status in sorted(FINISHED):
        _series().JOBS_PRUNED.labels(status=status)
    _series().NOTIFICATIONS_UNHEARD.inc(0)
    _series().JOBS_MOVED.inc(0)


# Attempts finished in this turn of the event loop: (kind, applied, duration).
_pending: list[tuple[Operation, bool, float]] = []


def attempt_finished(kind: Operation, applied: bool, duration: float) -> None:
    """Count an attempt whose outcome `kind` was written (`applied`) or found lost."""
    if not _pending:
        try:
            asyncio.get_running_loop().call_soon(flush)
        except RuntimeError:  # no event loop: count it now
            _pending.append((kind, applied, duration))
            flush()
            return
    _pending.append((kind, applied, duration))


def flush() -> None:
    """Write the counts of the attempts finished since the last flush."""
    finished = _pending[:]
    _pending.clear()
    durations: dict[Operation, list[float]] = {}
    applied_kinds: dict[Operation, int] = {}
    for kind, applied, duration in finished:
        durations.setdefault(kind, []).append(duration)
        if applied:
            applied_kinds[kind] = applied_kinds.get(kind, 0) + 1
    for kind, values in durations.items():
        observe_many(_series().JOB_DURATION.labels(outcome=kind.outcome), values)
    lost = sum(1 for _, applied, _ in finished if not applied)
    if lost:
        _series().JOBS_LEASE_LOST.inc(lost)
    if not _COUNTED:
        initialise()
    for kind, n in applied_kinds.items():
        counter = _COUNTED.get(kind)
        if counter is not None:
            counter.inc(n)


def observe_many(histogram: Any, values: Sequence[float]) -> None:
    """`histogram.observe(v)` for each value, with one update per bucket touched."""
    try:
        bounds, buckets, total = histogram._upper_bounds, histogram._buckets, histogram._sum
    except AttributeError:  # a prometheus_client without these internals: one at a time
        for value in values:
            histogram.observe(value)
        return
    counts: dict[int, int] = {}
    for value in values:
        # observe() counts a value in the first bucket whose upper bound is >= it.
        i = bisect_left(bounds, value)
        counts[i] = counts.get(i, 0) + 1
    total.inc(sum(values))
    for i, n in counts.items():
        buckets[i].inc(n)


def jobs_recovered(dead_lettered: int, total: int, cancelled: int = 0) -> None:
    _series().JOBS_RECOVERED.inc(total)
    if dead_lettered:
        _series().JOBS_FAILED.labels(status=Status.DEAD_LETTER).inc(dead_lettered)
    if cancelled:
        _series().JOBS_CANCELLED.inc(cancelled)


def job_unhandled(job_type: str) -> None:
    """Count a job given back for want of a handler for its type."""
    _series().JOBS_UNHANDLED.labels(type=job_type).inc()


def lease_lost(n: int) -> None:
    """Count leases a heartbeat found lost (their attempts were stopped)."""
    _series().JOBS_LEASE_LOST.inc(n)


def notifications_unheard() -> None:
    _series().NOTIFICATIONS_UNHEARD.inc()


def jobs_pruned(status: Status, n: int) -> None:
    _series().JOBS_PRUNED.labels(status=status).inc(n)


def jobs_moved(n: int) -> None:
    _series().JOBS_MOVED.inc(n)


def retention_ran() -> None:
    """Record that a retention run has just gone through every status."""
    _series().RETENTION_LAST_RUN.set_to_current_time()


# Queues whose gauges this process exports now.
_shown_queues: set[str] = set()


def show_queue_depths(depths: Sequence[QueueDepth], paused: Collection[str] = ()) -> None:
    """Export `depths` as the queue gauges, and whether each queue is `paused`; a queue
    shown before and absent now is hidden."""
    queues = set()
    for depth in depths:
        queues.add(depth.queue)
        _series().JOBS_QUEUE_PAUSED.labels(queue=depth.queue).set(1 if depth.queue in paused else 0)
        for status in DEPTH_STATUSES:
            _series().JOBS_QUEUED.labels(queue=depth.queue, status=status).set(
                getattr(depth, status)
            )
        _series().JOBS_OLDEST_PENDING_AGE.labels(queue=depth.queue).set(
            depth.oldest_pending_age_seconds
        )
    for queue in _shown_queues - queues:
        _hide_queue(queue)
    _shown_queues.clear()
    _shown_queues.update(queues)


def hide_queue_depths() -> None:
    """Stop exporting queue gauges from this process (it does not lead them)."""
    for queue in _shown_queues:
        _hide_queue(queue)
    _shown_queues.clear()


def _hide_queue(queue: str) -> None:
    for status in DEPTH_STATUSES:
        _hide(_series().JOBS_QUEUED, queue, status)
    _hide(_series().JOBS_OLDEST_PENDING_AGE, queue)
    _hide(_series().JOBS_QUEUE_PAUSED, queue)


def _hide(gauge: Gauge, *labels: str) -> None:
    value: Any = gauge.labels(*labels)._value
    if getattr(value, "_multiprocess", False):
        # A series cannot be removed from a metric file. The supervisor's merge shows, per
        # series, the value with the latest timestamp among its children, and a timestamp
        # of 0 is never the latest: the series is left out unless another child sets it
        # (tests/worker/test_maintenance_metrics.py holds prometheus-client to this).
        value.set(0.0, timestamp=0.0)
    else:
        gauge.remove(*labels)
