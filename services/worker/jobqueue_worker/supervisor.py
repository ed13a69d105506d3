"""The supervisor: runs WORKER_PROCESSES worker processes and the worker's HTTP endpoints.

It waits for the database schema to be at head, starts the children (spawn
method), and restarts one that dies unexpectedly after a delay that doubles
with each quick death (reset once a child has lived STABLE_AFTER seconds), so
a crash loop cannot spin. The first SIGTERM/SIGINT makes `/readyz` answer 503
and is forwarded to the children as SIGTERM (graceful shutdown); the
supervisor exits 0 when all of them have. A second signal kills them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

import sqlalchemy as sa
from prometheus_client import multiprocess

from jobcore.db import check_schema, make_engine
from jobcore.errors import SchemaNotAtHead
from jobcore.settings import Settings
from jobqueue_worker import child as child_process
from jobqueue_worker import server
from jobqueue_worker.database import describe

log = logging.getLogger("jobqueue.worker")

RESTART_FIRST = 0.5
RESTART_MAX = 30.0
STABLE_AFTER = 30.0
READY_TIMEOUT = 2.0
SCHEMA_TIMEOUT = 10.0


@dataclass(eq=False)
class _Child:
    index: int
    process: BaseProcess | None = None
    started_at: float = 0.0
    quick_deaths: int = 0
    restart: asyncio.TimerHandle | None = None


class Supervisor:
    def __init__(
        self, settings: Settings, metrics_dir: str, cleanup: Callable[[], None] = lambda: None
    ) -> None:
        self.settings = settings
        self.metrics_dir = metrics_dir
        self._cleanup = cleanup
        self._spawn = multiprocessing.get_context("spawn")
        self._children = [_Child(i) for i in range(settings.worker_processes)]
        self.restarts = 0
        self.shutting_down = False
        self.schema_ready = False
        self._signals = 0
        self._engine = make_engine(
            settings.database_url,
            pool_size=1,
            connect_timeout=READY_TIMEOUT,
            application_name="jobqueue-worker-supervisor",
            isolation_level="AUTOCOMMIT",
        )

    def pids(self) -> list[int]:
        return [c.process.pid for c in self._children if c.process and c.process.pid is not None]

    async def ready(self) -> tuple[bool, str]:
        if self.shutting_down:
            return False, "shutting down"
        if not self.schema_ready:
            return False, "starting"
        if not self.pids():
            return False, "no worker process running"
        try:
            async with asyncio.timeout(READY_TIMEOUT), self._engine.connect() as conn:
                await conn.execute(sa.text("SELECT 1"))
        except Exception:
            return False, "database unavailable"
        return True, "ready"

    async def run(self, sock: socket.socket) -> int:
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._all_exited = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        registry = server.scrape_registry(self.metrics_dir, self.pids, lambda: self.restarts)
        http_stopped = asyncio.Event()
        http = asyncio.create_task(
            server.serve(server.build_app(self.ready, registry), sock, http_stopped)
        )
        try:
            if not await self._wait_for_schema():
                return 0  # told to stop before anything ran
            for child in self._children:
                self._start(child)
            log.info(
                "worker started",
                extra={
                    "worker_processes": self.settings.worker_processes,
                    "workers": self.settings.workers,
                    "metrics_addr": self.settings.metrics_addr,
                },
            )
            await self._stop.wait()
            return await self._shutdown()
        except SchemaNotAtHead as exc:
            log.error(str(exc), extra={"found": exc.found, "expected": exc.expected})
            return 1
        finally:
            http_stopped.set()
            await asyncio.wait({http}, timeout=5)
            await self._engine.dispose()

    async def _wait_for_schema(self) -> bool:
        """Check the schema is at head, waiting out an unreachable database; False if stopped."""
        delay, down = 0.5, False
        while not self.shutting_down:
            try:
                async with asyncio.timeout(SCHEMA_TIMEOUT):
                    await check_schema(self._engine)
            except SchemaNotAtHead:
                raise
            except Exception as exc:
                if not down:
                    log.warning("database unavailable", extra={"error": describe(exc)})
                    down = True
                try:
                    async with asyncio.timeout(delay):
                        await self._stop.wait()
                except TimeoutError:
                    delay = min(delay * 2, 5.0)
                continue
            if down:
                log.info("database available again")
            self.schema_ready = True
            return True
        return False

    def _start(self, child: _Child) -> None:
        child.restart = None
        if self.shutting_down:
            return
        process = self._spawn.Process(
            target=child_process.main,
            args=(self.settings, child.index),
            name=f"jobqueue-worker-{child.index}",
        )
        process.start()
        child.process, child.started_at = process, time.monotonic()
        asyncio.get_running_loop().add_reader(process.sentinel, self._exited, child)

    def _exited(self, child: _Child) -> None:
        process = child.process
        assert process is not None
        asyncio.get_running_loop().remove_reader(process.sentinel)
        process.join()  # its sentinel fired: this reaps it at once
        pid, code = process.pid, process.exitcode
        process.close()
        child.process = None
        if pid is not None:
            multiprocess.mark_process_dead(pid, self.metrics_dir)  # type: ignore[no-untyped-call]
        fields = {"worker_process": child.index, "pid": pid, "exitcode": code}
        if self.shutting_down:
            log.info("worker process exited", extra=fields)
            if not self.pids():
                self._all_exited.set()
            return
        if time.monotonic() - child.started_at >= STABLE_AFTER:
            child.quick_deaths = 0
        delay = min(RESTART_FIRST * 2 ** min(child.quick_deaths, 16), RESTART_MAX)
        child.quick_deaths += 1
        self.restarts += 1
        log.warning("worker process died, restarting", extra={**fields, "restart_in": delay})
        child.restart = asyncio.get_running_loop().call_later(delay, self._start, child)

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            log.info("shutting down", extra={"signal": name})
            self.shutting_down = True
            self._stop.set()
            for child in self._children:
                if child.restart is not None:
                    child.restart.cancel()
                    child.restart = None
            self._kill(signal.SIGTERM)
            return
        log.warning("second signal, stopping at once", extra={"signal": name})
        self._kill(signal.SIGKILL)
        logging.shutdown()
        sys.stdout.flush()
        self._cleanup()
        os._exit(128 + signum)

    def _kill(self, sig: int) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    async def _shutdown(self) -> int:
        if not self.pids():
            log.info("worker stopped")
            return 0
        # A child takes at most SHUTDOWN_TIMEOUT, a moment to cancel, then outcome writes
        # retried while their leases hold; past that something is wrong.
        limit = self.settings.shutdown_timeout + self.settings.lease_duration + 10
        try:
            async with asyncio.timeout(limit):
                await self._all_exited.wait()
        except TimeoutError:
            log.error("worker processes did not stop in time, killing them")
            self._kill(signal.SIGKILL)
            await self._all_exited.wait()
            return 1
        log.info("worker stopped")
        return 0
