"""The supervisor's HTTP endpoints on METRICS_ADDR, served by Hypercorn.

`/metrics` sums the children's metric files (prometheus-client multiprocess
mode) and adds process metrics; `/healthz` answers 200 unless the supervisor says it is
not alive (a worker process that cannot start; never the database); `/readyz` answers 200
only while the supervisor says it is ready.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import NamedTuple

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from jobcore.settings import Address

log = logging.getLogger(__name__)

Readiness = Callable[[], Awaitable[tuple[bool, str]]]


class Counts(NamedTuple):
    """What the supervisor knows of its children, for `/metrics`."""

    pids: list[int]
    restarts: int
    stalls: int
    recycles: int
    abandoned_handlers: int


def listen(addr: Address) -> socket.socket:
    """Bind METRICS_ADDR now, so a taken port is reported before any child starts."""
    host, port = addr
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=128)


def build_app(
    ready: Readiness,
    registry: CollectorRegistry,
    healthy: Readiness | None = None,
    notifications: Callable[[], str] | None = None,
) -> Starlette:
    async def healthz(request: Request) -> Response:
        ok, reason = (True, "ok") if healthy is None else await healthy()
        return JSONResponse({"status": reason}, status_code=200 if ok else 503)

    async def readyz(request: Request) -> Response:
        ok, reason = await ready()
        body = {"status": "ready" if ok else reason}
        if notifications is not None:
            # Not a reason to be unready: the worker claims by polling meanwhile.
            body["notifications"] = notifications()
        return JSONResponse(body, status_code=200 if ok else 503)

    def metrics(request: Request) -> Response:
        # A plain def: Starlette runs it in a thread, and reading the metric files is file I/O.
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            return JSONResponse({"error": exc.detail}, status_code=exc.status_code)
        log.error("unhandled error", exc_info=exc, extra={"path": request.url.path})
        return JSONResponse({"error": "internal error"}, status_code=500)

    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
        ],
        exception_handlers={HTTPException: error, Exception: error},
    )


async def serve(app: Starlette, sock: socket.socket, stopped: asyncio.Event) -> None:
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # Hypercorn takes the bound socket over
    config.errorlog = logging.getLogger("hypercorn.error")  # JSON lines like every other log
    config.accesslog = None
    config.graceful_timeout = 1.0
    await hypercorn_serve(app, config, shutdown_trigger=stopped.wait)  # type: ignore[arg-type]


def scrape_registry(metrics_dir: str, counts: Callable[[], Counts]) -> CollectorRegistry:
    """The registry `/metrics` renders: children's metrics summed, plus process metrics."""
    registry = CollectorRegistry()
    registry.register(_Files(metrics_dir))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    registry.register(_Children(counts))
    return registry


class _Files:
    """The children's metric files, summed (prometheus-client's multiprocess collector),
    less any file a child has only just created: it stays empty until the child sizes it,
    and an empty file cannot be read (the scrape would fail)."""

    def __init__(self, metrics_dir: str) -> None:
        self._dir = metrics_dir

    def collect(self) -> Iterable[Metric]:
        files = [f for f in glob.glob(os.path.join(self._dir, "*.db")) if _sized(f)]
        return MultiProcessCollector.merge(files, accumulate=True)  # type: ignore[no-any-return,no-untyped-call]


def _sized(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except FileNotFoundError:  # a dead child's live gauges, removed since the listing
        return False


class _Children:
    """Worker processes: count, restarts, stalls, recycles, abandoned handlers, and their
    CPU and memory, summed."""

    def __init__(self, counts: Callable[[], Counts]) -> None:
        self._counts = counts
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._page = os.sysconf("SC_PAGE_SIZE")

    def collect(self) -> Iterator[Metric]:
        counts = self._counts()
        pids = counts.pids
        yield GaugeMetricFamily("worker_processes", "Worker processes running.", value=len(pids))
        yield CounterMetricFamily(
            "worker_process_restarts",
            "Worker processes restarted after an unexpected exit (stalls and recycles included).",
            value=counts.restarts,
        )
        yield CounterMetricFamily(
            "worker_process_stalls",
            "Worker processes killed because their event loop stopped turning.",
            value=counts.stalls,
        )
        yield CounterMetricFamily(
            "worker_process_recycles",
            "Worker processes that restarted themselves over too many abandoned handlers.",
            value=counts.recycles,
        )
        yield GaugeMetricFamily(
            "worker_abandoned_handlers",
            "Handlers still running after their attempt was recorded without them.",
            value=counts.abandoned_handlers,
        )
        cpu, rss = self._usage(pids)
        yield CounterMetricFamily(
            "worker_processes_cpu_seconds",
            "User and system CPU time of the running worker processes.",
            value=cpu,
        )
        yield GaugeMetricFamily(
            "worker_processes_resident_memory_bytes",
            "Resident memory of the running worker processes.",
            value=rss,
        )

    def _usage(self, pids: Iterable[int]) -> tuple[float, float]:
        cpu = rss = 0.0
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue  # not Linux, or the process just exited
            fields = stat[stat.rfind(b")") + 2 :].split()
            cpu += (float(fields[11]) + float(fields[12])) / self._ticks
            rss += float(fields[21]) * self._page
        return cpu, rss
