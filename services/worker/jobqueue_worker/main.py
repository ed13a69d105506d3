"""The `jobqueue-worker` console script: settings, logs, handlers, then the supervisor.

Invalid configuration (the OTEL_* variables too, tracing on) prints one JSON line naming
the variable and exits 2, before any worker process starts. A schema that is not at head
exits 1 with a line telling the operator to run `alembic upgrade head`.

The fork server the worker processes come from (`jobqueue_worker.launch`) is started
first, so it imports the worker while this process imports its own modules: those are
imported inside the functions below, after it (docs/performance.md, "Start-up").
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from typing import TYPE_CHECKING

from jobqueue_worker import launch

if TYPE_CHECKING:
    from collections.abc import Callable

    from jobcore.settings import WorkerSettings

log = logging.getLogger("jobqueue.worker")

METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


def main() -> None:
    # prometheus_client picks its storage when first imported: the directory must be set
    # before this process or the fork server imports it, so every child writes files there.
    metrics_dir = os.environ.get(METRICS_DIR_VARIABLE)
    created = not metrics_dir
    if not metrics_dir:
        metrics_dir = tempfile.mkdtemp(prefix="jobqueue-worker-metrics-")
        os.environ[METRICS_DIR_VARIABLE] = metrics_dir

    def cleanup() -> None:
        if created:
            shutil.rmtree(metrics_dir, ignore_errors=True)

    try:
        launch.start_server()
        sys.exit(_configured_run(metrics_dir, cleanup))
    finally:
        cleanup()


def _configured_run(metrics_dir: str, cleanup: Callable[[], None]) -> int:
    from jobcore import logs, naming, tracing
    from jobcore.errors import ConfigError
    from jobcore.registry import load_handlers
    from jobcore.settings import load_worker_settings

    try:
        settings = load_worker_settings()
        naming.use(settings.database_schema)
        logs.configure(settings.log_level)
        load_handlers(settings.job_handlers)
        _warn_of_unserved_queues(settings)
        # Each worker process starts its own tracer: its OTEL_* variables are checked here,
        # once, rather than failing every worker process as it starts.
        tracing.check()
    except ConfigError as exc:
        logs.configure("info")
        log.error(f"invalid configuration: {exc}", extra={"variable": exc.variable})
        return 2
    return run(settings, metrics_dir, cleanup)


def _warn_of_unserved_queues(settings: WorkerSettings) -> None:
    """A handler whose `queue` option this worker does not serve: its jobs wait for a worker
    that does (QUEUES), which is easy to miss, so say it once at start."""
    from jobcore.registry import registered_options

    for job_type, options in sorted(registered_options().items()):
        queue = options.get("queue")
        if queue is not None and queue not in settings.queues:
            log.warning(
                f"handler {job_type!r} sends its jobs to queue {queue!r}, which this worker"
                f" does not serve (QUEUES: {', '.join(settings.queues)})",
                extra={"type": job_type, "queue": queue},
            )


def run(settings: WorkerSettings, metrics_dir: str, cleanup: Callable[[], None]) -> int:
    import asyncio

    from jobcore import environ
    from jobqueue_worker import server
    from jobqueue_worker.supervisor import Supervisor

    try:
        sock = server.listen(settings.metrics_addr)
    except OSError as exc:
        variable = environ.variable("METRICS_ADDR")
        log.error(
            f"cannot listen on {variable} {settings.metrics_addr}: {exc.strerror or exc}",
            extra={"variable": variable},
        )
        return 1
    log.info(
        "worker starting",
        extra={"pid": os.getpid(), "metrics_addr": str(settings.metrics_addr)},
    )
    return asyncio.run(Supervisor(settings, metrics_dir, cleanup).run(sock))
