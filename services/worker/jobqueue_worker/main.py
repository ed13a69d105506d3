"""The `jobqueue-worker` console script: settings, logs, handlers, then the supervisor.

Invalid configuration prints one JSON line naming the variable and exits 2. A
schema that is not at head exits 1 with a line telling the operator to run
`alembic upgrade head`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
import tempfile

from jobcore import logs, tracing
from jobcore.errors import ConfigError
from jobcore.registry import load_handlers
from jobcore.settings import Settings, load_settings

log = logging.getLogger("jobqueue.worker")

METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


def main() -> None:
    try:
        settings = load_settings()
        logs.configure(settings.log_level)
        load_handlers(settings.handler_modules)
        tracing.check()  # each worker process starts its own tracer
    except ConfigError as exc:
        logs.configure("info")
        log.error(f"invalid configuration: {exc}", extra={"variable": exc.variable})
        sys.exit(2)
    sys.exit(run(settings))


def run(settings: Settings) -> int:
    # prometheus_client picks its storage when first imported: the directory must be set
    # before this process or any child imports it, so every child writes to files there.
    metrics_dir = os.environ.get(METRICS_DIR_VARIABLE)
    created = not metrics_dir
    if not metrics_dir:
        metrics_dir = tempfile.mkdtemp(prefix="jobqueue-worker-metrics-")
        os.environ[METRICS_DIR_VARIABLE] = metrics_dir

    def cleanup() -> None:
        if created:
            shutil.rmtree(metrics_dir, ignore_errors=True)

    from jobqueue_worker import server
    from jobqueue_worker.supervisor import Supervisor

    try:
        try:
            sock = server.listen(settings.metrics_addr)
        except OSError as exc:
            log.error(
                f"cannot listen on METRICS_ADDR {settings.metrics_addr}: {exc.strerror or exc}",
                extra={"variable": "METRICS_ADDR"},
            )
            return 1
        log.info(
            "worker starting",
            extra={"pid": os.getpid(), "metrics_addr": settings.metrics_addr},
        )
        return asyncio.run(Supervisor(settings, metrics_dir, cleanup).run(sock))
    finally:
        cleanup()
