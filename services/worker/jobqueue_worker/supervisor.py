"""The supervisor: runs WORKER_PROCESSES worker processes and the worker's HTTP endpoints.

It waits for the database schema to be at head, starts the children (forked
from the fork server of `jobqueue_worker.launch`), and restarts one that dies
unexpectedly after a delay that grows with each quick death (a
`jobcore.backoff.Retry`, reset once a child has lived STABLE_AFTER seconds), so a
crash loop cannot spin. A child that exits before it has started (its loop never
ran, so restarting it cannot help: an import, the environment) makes `/healthz`
answer 503 until one started again, and after START_ATTEMPTS such exits in a row
the supervisor gives up: one error line, the other children stopped gracefully,
exit status 1 (2 when the child exited 2, invalid configuration). The first
SIGTERM/SIGINT makes `/readyz` answer 503 and is forwarded to the children as
SIGTERM (graceful shutdown); the supervisor exits 0 when all of them have. A
second signal kills them at once.

Each child's event loop turns a heartbeat (`jobqueue_worker.liveness`). A child
whose loop has not turned for STALL_LIMIT (a handler blocks it) is killed and
restarted like a crashed one; during shutdown SHUTDOWN_STALL_LIMIT is enough,
since waiting for it only delays the exit. A child stopped by SIGSTOP is not
judged until it runs again. `/readyz` answers 503 while a child's loop has not
turned for STALLED_AFTER, and when no child can take jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess

from prometheus_client import multiprocess

from jobcore.backoff import Retry
from jobcore.db import check_schema, make_engine, probe_writable, session_name
from jobcore.errors import ReadOnlyServer, SchemaNotAtHead, describe
from jobcore.notifications import OK, UNCHECKED, UNHEARD
from jobcore.settings import WorkerSettings
from jobqueue_worker import launch, server
from jobqueue_worker.liveness import BEAT, OWN_LATENESS, RUNNING, STARTING, Beacon

log = logging.getLogger("jobqueue.worker")

RESTART_FIRST = 0.5
RESTART_MAX = 30.0
STABLE_AFTER = 30.0
READY_TIMEOUT = 2.0
# Exits in a row of a child before it started (with the restart waits: about 8 s) after
# which the supervisor gives up.
START_ATTEMPTS = 5
SCHEMA_TIMEOUT = 10.0
# Seconds without a turn of a child's loop before: /readyz says stalled; the child is
# killed; the child is killed during shutdown.
STALLED_AFTER = 5.0
STALL_LIMIT = 10.0
SHUTDOWN_STALL_LIMIT = 2.5


@dataclass(eq=False)
class _Child:
    index: int
    process: BaseProcess | None = None
    started_at: float = 0.0
    # Deaths in a row, each before STABLE_AFTER: the restart waits grow with them.
    deaths: Retry = field(default_factory=lambda: Retry(RESTART_FIRST, RESTART_MAX))
    restart: asyncio.TimerHandle | None = None
    beacon: Beacon | None = None
    # Last time the supervisor saw it stopped (SIGSTOP): its loop could not turn before.
    seen_stopped: float = 0.0
    killed_for_stall: bool = False
    # Exits in a row before its event loop ran (or starts that failed): START_ATTEMPTS of
    # them and the supervisor gives up.
    start_failures: int = 0

    @property
    def started(self) -> bool:
        """Whether its process runs and has started (its loop ran: not STARTING)."""
        return (
            self.process is not None and self.beacon is not None and self.beacon.state != STARTING
        )

    @property
    def cannot_start(self) -> bool:
        """Its last process exited before it started, and no new one has started yet."""
        return self.start_failures > 0 and not self.started

    def stalled_for(self, now: float) -> float:
        """Seconds since its loop last turned; 0 while it is starting or gone."""
        if self.process is None or self.beacon is None or not self.beacon.last_beat:
            return 0.0
        return max(0.0, now - max(self.beacon.last_beat, self.seen_stopped))


class Supervisor:
    def __init__(
        self, settings: WorkerSettings, metrics_dir: str, cleanup: Callable[[], None] = lambda: None
    ) -> None:
        self.settings = settings
        self.metrics_dir = metrics_dir
        self._cleanup = cleanup
        self._context = launch.context()
        self._children = [_Child(i) for i in range(settings.worker_processes)]
        self.restarts = 0
        self.stalls = 0
        self.recycles = 0
        self.shutting_down = False
        self.schema_ready = False
        # The exit status once the supervisor gave up on a child that cannot start.
        self.gave_up: int | None = None
        self._signals = 0
        self._engine = make_engine(
            settings.database_url,
            pool_size=1,
            connect_timeout=READY_TIMEOUT,
            application_name=session_name("jobqueue-worker-supervisor"),
            isolation_level="AUTOCOMMIT",
        )

    def pids(self) -> list[int]:
        return [c.process.pid for c in self._children if c.process and c.process.pid is not None]

    def abandoned_handlers(self) -> int:
        return sum(c.beacon.abandoned for c in self._children if c.process and c.beacon)

    async def healthy(self) -> tuple[bool, str]:
        """Liveness: false while a child cannot start (restarting it is not helping), never
        for the database."""
        if self.gave_up is not None or any(c.cannot_start for c in self._children):
            return False, "worker process cannot start"
        return True, "ok"

    def notifications(self) -> str:
        """The running children's notification checks together: unheard if any child's
        latest check heard nothing, ok once every one heard."""
        verdicts = {
            c.beacon.notifications
            for c in self._children
            if c.process and c.beacon and c.beacon.state == RUNNING
        }
        if UNHEARD in verdicts:
            return UNHEARD
        return OK if verdicts == {OK} else UNCHECKED

    async def ready(self) -> tuple[bool, str]:
        if self.shutting_down:
            return False, "shutting down"
        if not self.schema_ready:
            return False, "starting"
        if not self.pids():
            return False, "no worker process running"
        now = time.monotonic()
        if any(c.stalled_for(now) > STALLED_AFTER for c in self._children):
            return False, "worker process stalled"
        if not any(c.process and c.beacon and c.beacon.state == RUNNING for c in self._children):
            return False, "no worker process can take jobs"
        try:
            # Writable: a standby the URL let it reach takes no claim.
            async with asyncio.timeout(READY_TIMEOUT):
                await probe_writable(self._engine)
        except ReadOnlyServer:
            return False, "database read-only"
        except Exception:
            return False, "database unavailable"
        return True, "ready"

    async def run(self, sock: socket.socket) -> int:
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._all_exited = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        registry = server.scrape_registry(self.metrics_dir, self._counts)
        http_stopped = asyncio.Event()
        http = asyncio.create_task(
            server.serve(
                server.build_app(
                    self.ready, registry, healthy=self.healthy, notifications=self.notifications
                ),
                sock,
                http_stopped,
            )
        )
        try:
            if not await self._wait_for_schema():
                return 0  # told to stop before anything ran
            for child in self._children:
                self._start(child)
            watching = asyncio.create_task(self._watch())
            log.info(
                "worker started",
                extra={
                    "worker_processes": self.settings.worker_processes,
                    "workers": self.settings.workers,
                    "metrics_addr": str(self.settings.metrics_addr),
                },
            )
            await self._stop.wait()
            try:
                status = await self._shutdown()
            finally:
                watching.cancel()
            return status if self.gave_up is None else max(status, self.gave_up)
        except SchemaNotAtHead as exc:
            log.error(str(exc), extra={"found": exc.found, "expected": exc.expected})
            return 1
        finally:
            http_stopped.set()
            await asyncio.wait({http}, timeout=5)
            await self._engine.dispose()

    async def _wait_for_schema(self) -> bool:
        """Check the schema is at head, waiting out an unreachable database; False if stopped."""
        retry, down = Retry(0.5, 5.0), False
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
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(retry.failed()):
                        await self._stop.wait()
                continue
            if down:
                log.info("database available again")
            self.schema_ready = True
            return True
        return False

    def _counts(self) -> server.Counts:
        return server.Counts(
            pids=self.pids(),
            restarts=self.restarts,
            stalls=self.stalls,
            recycles=self.recycles,
            abandoned_handlers=self.abandoned_handlers(),
        )

    def _start(self, child: _Child) -> None:
        child.restart = None
        if self.shutting_down:
            return
        beacon = Beacon(self._context)
        process = self._context.Process(
            target=launch.entry,
            args=(self.settings, child.index, beacon),
            name=f"jobqueue-worker-{child.index}",
        )
        try:
            process.start()
        except Exception as exc:  # the fork server could not be started or reached
            child.start_failures += 1
            fields = {"worker_process": child.index, "error": describe(exc)}
            if child.start_failures >= START_ATTEMPTS:
                self._give_up(child, fields, 1)
                return
            delay = child.deaths.failed()
            log.error(
                "worker process could not be started, retrying",
                extra={**fields, "restart_in": delay},
            )
            child.restart = asyncio.get_running_loop().call_later(delay, self._start, child)
            return
        child.process, child.started_at = process, time.monotonic()
        child.beacon, child.seen_stopped, child.killed_for_stall = beacon, 0.0, False
        asyncio.get_running_loop().add_reader(process.sentinel, self._exited, child)

    def _exited(self, child: _Child) -> None:
        process = child.process
        assert process is not None
        started = child.started
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
            child.deaths.succeeded()
        child.start_failures = 0 if started else child.start_failures + 1
        if child.start_failures >= START_ATTEMPTS:
            self._give_up(child, fields, 2 if code == 2 else 1)
            return
        delay = child.deaths.failed()
        self.restarts += 1
        if not started:
            message = "worker process exited before it started, restarting"
            fields["start_failures"] = child.start_failures
        elif code == launch.RECYCLE_EXIT:
            self.recycles += 1
            message = "worker process recycled, restarting"
        else:
            message = "worker process died, restarting"
        log.warning(message, extra={**fields, "restart_in": delay})
        child.restart = asyncio.get_running_loop().call_later(delay, self._start, child)

    async def _watch(self) -> None:
        """Kill children whose loop stopped turning; see the module docstring."""
        checked = time.monotonic()
        while True:
            await asyncio.sleep(BEAT)
            now = time.monotonic()
            late, checked = now - checked > BEAT + OWN_LATENESS, now
            if late:
                continue  # this loop did not run either: nothing to judge by
            limit = SHUTDOWN_STALL_LIMIT if self.shutting_down else STALL_LIMIT
            for child in self._children:
                if child.process is None or child.killed_for_stall:
                    continue
                if _is_stopped(child.process.pid):
                    child.seen_stopped = now
                    continue
                stalled = child.stalled_for(now)
                if stalled > limit:
                    self._kill_stalled(child, stalled)

    def _kill_stalled(self, child: _Child, stalled: float) -> None:
        assert child.process is not None and child.beacon is not None
        pid = child.process.pid
        report = child.beacon.report()
        log.error(
            "worker process stalled, killing it",
            extra={
                "worker_process": child.index,
                "pid": pid,
                "stalled_for": round(stalled, 3),
                "job_id": report.get("job_id"),
                "running_jobs": report.get("running_jobs", []),
                "where": report.get("where", []),
            },
        )
        child.killed_for_stall = True
        self.stalls += 1
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _give_up(self, child: _Child, fields: Mapping[str, object], status: int) -> None:
        """Stop everything: `child` exited START_ATTEMPTS times in a row before it started."""
        self.gave_up = status
        log.error(
            "worker process cannot start: giving up",
            extra={**fields, "start_failures": child.start_failures},
        )
        self._begin_shutdown()

    def _begin_shutdown(self) -> None:
        self.shutting_down = True
        self._stop.set()
        for child in self._children:
            if child.restart is not None:
                child.restart.cancel()
                child.restart = None
        self._kill(signal.SIGTERM)

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            log.info("shutting down", extra={"signal": name})
            self._begin_shutdown()
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


def _is_stopped(pid: int | None) -> bool:
    """Whether the process is stopped by a signal (or traced); False if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"T", b"t")
