"""The API's Prometheus metrics, with the process metrics, in a registry of their own.

Their own registry: the worker uses some of the same names (`jobs_cancelled_total`), and
a process that imports both services (the tests do) must not register a name twice.

With API_PROCESSES > 1 every process writes its values to files in PROMETHEUS_MULTIPROC_DIR
(prometheus-client's multiprocess mode, set up by `jobqueue_api.processes`), and whichever
process answers `/metrics` sums them all: a scrape sees the service, not one process.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

# Set (with the metrics directory) for the processes of API_PROCESSES > 1.
MULTIPROCESS = "JOBQUEUE_API_METRICS_SUMMED"

REGISTRY = CollectorRegistry(auto_describe=True)
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_collector)

SUBMITTED = Counter(
    "jobs_submitted",
    "Jobs created through the API (idempotent replays excluded).",
    registry=REGISTRY,
)

# The worker counts, under the same name, the running attempts it stops on request.
CANCELLED = Counter(
    "jobs_cancelled",
    "Jobs cancelled at once through the API (pending or dead_letter when asked).",
    registry=REGISTRY,
)

NOTIFICATIONS_UNHEARD = Counter(
    "jobs_notifications_unheard",
    "Notification checks whose notification the API's listener did not hear in time (a wait"
    " then reads its job every WAIT_POLL_INTERVAL instead).",
    registry=REGISTRY,
)

REJECTED = Counter(
    "jobs_rejected",
    "Create requests (POST /jobs, POST /jobs/batch: one per request) refused, by reason: "
    "admission (429, MAX_PENDING) or validation (400, 413).",
    ["reason"],
    registry=REGISTRY,
)
# The create routes' refusals, by status; created up front so both series exist from zero.
_REFUSALS = {
    429: REJECTED.labels("admission"),
    400: REJECTED.labels("validation"),
    413: REJECTED.labels("validation"),
}
_CREATE_ROUTES = frozenset({"/jobs", "/jobs/batch"})

REQUEST_DURATION = Histogram(
    "http_request_duration_seconds",
    "Time to answer an HTTP request, by route template (not raw path).",
    ["method", "route", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)

# Anything else is counted as OTHER so arbitrary methods cannot create new series.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    method = method if method in _METHODS else "OTHER"
    REQUEST_DURATION.labels(method, route, str(status)).observe(seconds)
    refusal = _REFUSALS.get(status)
    if refusal is not None and method == "POST" and route in _CREATE_ROUTES:
        refusal.inc()


def render() -> tuple[bytes, str]:
    """The metrics page and its content type."""
    if os.environ.get(MULTIPROCESS):
        summed = CollectorRegistry()
        MultiProcessCollector(summed)  # type: ignore[no-untyped-call]
        return generate_latest(summed), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
