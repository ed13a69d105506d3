"""The system under test in a chaos run: the cluster, a fault proxy per service, 2 APIs, 3 workers.

Every service reaches PostgreSQL through a `FaultProxy` of its own, so a
network fault can hit one service while the others keep working. A replicated system
(`replicated=True`, for the `failover` fault) has a synchronous standby too: each service
gets a proxy to each server, both in its multi-host `DATABASE_URL` with
`target_session_attrs=read-write`, and a network fault hits both; `cluster` is whichever
server is the primary, `standby` the other. The workers
delete finished jobs after a short retention, so pruning runs during the faults;
the database keeps a copy of every row they delete (`tests.chaos.audit`). Each service
incarnation (a restart makes a new one) writes its stdout to its own file
under the run directory; the checker reads them all at the end.

With a previous release (`tests.chaos.rollout.Release`) the database starts at that
release's schema, migrated by its own tree, and the services that start are that
release's (`api-prev-*`, `worker-prev-*`); the head's own services wait, staged, until
the rollout phase launches them (`launch_staged`) and retires the old ones (`retire`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psycopg
from alembic import command

from tests.chaos import audit
from tests.chaos.cluster import DATABASE, Cluster
from tests.faultproxy import FaultProxy
from tests.infra.replication import STANDBY_NAME, Standby, allow_rewind, make_synchronous
from tests.pg import alembic_config
from tests.procs import BIN, free_port

if TYPE_CHECKING:
    from tests.chaos.rollout import Release

ROOT = Path(__file__).resolve().parent.parent.parent

# Short timings so leases expire, recovery runs and retries happen within a short run. The
# lease is short too (its heartbeats renew it every third of it), so a paused or cut-off
# worker loses its jobs quickly, and long jobs (tests.chaos.load) outlive it several times
# within a short run; they carry a timeout of their own, past JOB_TIMEOUT.
TIMINGS = {
    "JOB_TIMEOUT": "2s",
    "LEASE_DURATION": "4s",
    "RECOVERY_INTERVAL": "1s",
    "POLL_INTERVAL": "200ms",
    # Shorter than JOB_TIMEOUT, so a SIGTERM can interrupt a job and release it.
    "SHUTDOWN_TIMEOUT": "1s",
    "BACKOFF_BASE": "100ms",
    "BACKOFF_MAX": "1s",
    "MAX_ATTEMPTS": "5",
}
LEASE_SECONDS = 4.0
WORKER_PROCESSES = 2
# Every queue of the load's mix (tests.chaos.load.QUEUE_MIX), one with fewer slots.
QUEUES = "default,bulk,urgent:4"
# At most this many jobs of one (queue, concurrency key) run at once, across every worker.
KEY_LIMIT = 2
# TYPE_CONCURRENCY of the workers: chaos-slow jobs (the load's "slow" kinds) are claimed by
# the claim under per-type limits, from its floors, through the held horizon and the faults.
TYPE_LIMIT = ("chaos-slow", 6)
# The retention variables the workers get: each finished status is deleted this long after
# it finished (RETENTION_FAILED covers cancelled jobs too), so pruning runs during faults.
RETENTION_VARIABLES = {
    "RETENTION_COMPLETED": "completed",
    "RETENTION_FAILED": "failed",
    "RETENTION_DEAD_LETTER": "dead_letter",
}
DEFAULT_RETENTION = 30.0
# Completed jobs are kept this many times as long: a minute after they finish the workers
# move them to `jobs_history` (`jobcore.history.MOVE_AFTER`), so the run goes through the
# move, and through retention there, as well.
COMPLETED_FACTOR = 3.0


def retention_ages(retention: float) -> dict[str, float]:
    """The age (seconds) at which the chaos workers delete each finished status."""
    ages = {status: retention for status in RETENTION_VARIABLES.values()}
    ages["completed"] = retention * COMPLETED_FACTOR
    return {**ages, "cancelled": ages["failed"]}


class Process:
    """One incarnation of a console script (or of `argv`, a previous release's way to start
    it), in a session of its own, stdout to a file."""

    def __init__(
        self, command: str, env: dict[str, str], log: Path, argv: list[str] | None = None
    ) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                argv or [str(BIN / command)],
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.proc.pid
        self._read = 0
        self._reading = threading.Lock()  # the rollout's monitor reads it from a thread
        self.started_children: set[int] = set()

    def working_children(self) -> list[int]:
        """Children that are past their imports and running (they logged their start)."""
        with self._reading:
            with open(self.log, "rb") as f:
                f.seek(self._read)
                data = f.read()
            data = data[: data.rfind(b"\n") + 1]
            self._read += len(data)
            for line in data.splitlines():
                if b'"worker process started"' in line:
                    self.started_children.add(int(json.loads(line)["pid"]))
        return [pid for pid in self.children() if pid in self.started_children]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def children(self) -> list[int]:
        """Pids of the worker processes running under this one: the children of its fork
        server (docs/worker.md, "Start"), or its own spawned children (an earlier worker)."""
        processes = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_bytes()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            processes[int(entry.name)] = (int(stat[stat.rfind(b")") + 2 :].split()[1]), cmdline)
        servers = {
            pid
            for pid, (ppid, cmdline) in processes.items()
            if ppid == self.pid and b"multiprocessing.forkserver" in cmdline
        }
        return sorted(
            pid
            for pid, (ppid, cmdline) in processes.items()
            if ppid in servers or (ppid == self.pid and b"spawn_main" in cmdline)
        )

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def kill_group(self) -> None:
        """SIGKILL the whole process group (the service and every process it started)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


class Proxies:
    """A service's fault proxies, one per server of its URL: each fault applies to all."""

    def __init__(self, clusters: list[Cluster]) -> None:
        self.proxies = [FaultProxy(("127.0.0.1", cluster.port)) for cluster in clusters]

    def database_url(self) -> str:
        hosts = ",".join(f"{proxy.host}:{proxy.port}" for proxy in self.proxies)
        query = "?target_session_attrs=read-write" if len(self.proxies) > 1 else ""
        return f"postgresql://postgres@{hosts}/{DATABASE}{query}"

    def pass_through(self) -> None:
        for proxy in self.proxies:
            proxy.pass_through()

    def add_latency(self, seconds: float) -> None:
        for proxy in self.proxies:
            proxy.add_latency(seconds)

    def refuse(self) -> None:
        for proxy in self.proxies:
            proxy.refuse()

    def blackhole(self) -> None:
        for proxy in self.proxies:
            proxy.blackhole()

    def cut(self) -> None:
        for proxy in self.proxies:
            proxy.cut()

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()


@dataclass(eq=False)
class Service:
    """A named service slot (`api-0`, `worker-2`): its proxy, port and incarnations."""

    name: str
    command: str
    port: int
    proxy: Proxies
    env: dict[str, str]
    incarnations: list[Process] = field(default_factory=list)
    argv: list[str] | None = None  # how to start it, if not the head's console script
    release: str = "head"  # the commit its code comes from

    @property
    def current(self) -> Process:
        return self.incarnations[-1]

    @property
    def is_worker(self) -> bool:
        return self.command == "jobqueue-worker"

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


class System:
    """Owns every process, proxy and directory of a run; `close()` removes them all."""

    def __init__(
        self,
        run_dir: Path,
        apis: int = 2,
        workers: int = 3,
        slots: int = 8,
        retention: float = DEFAULT_RETENTION,
        previous: Release | None = None,
        previous_apis: int = 1,
        previous_workers: int = 2,
        replicated: bool = False,
    ) -> None:
        self.run_dir = run_dir
        self.retention = retention
        # A tests.chaos.rollout.Release: its services start first, the head's are staged.
        self.previous = previous
        self._previous_counts = (previous_apis, previous_workers)
        self.exec_dir = run_dir / "executions"
        self.logs_dir = run_dir / "logs"
        self.exec_dir.mkdir(parents=True)
        self.logs_dir.mkdir()
        self.cluster = Cluster()  # the primary
        self.standby: Cluster | None = Standby(self.cluster) if replicated else None
        # The name `cluster` waits for at every commit; None while no standby streams.
        self.standby_name: str | None = STANDBY_NAME if replicated else None
        self.failovers = 0
        self.services: list[Service] = []  # in service: the faults, readiness and the stop
        self.staged: list[Service] = []  # the head's, waiting for the rollout to start them
        self.retired: list[Service] = []  # stopped for good (a previous release's)
        self._apis, self._workers, self._slots = apis, workers, slots
        self.http = httpx.Client(timeout=2.0)
        self._observer: psycopg.Connection | None = None

    # --- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        self.cluster.init()
        if self.standby is not None:
            allow_rewind(self.cluster)
        self.cluster.start()
        self.cluster.create_database()
        if self.standby is not None:
            self.standby.init()
            self.standby.start()
            make_synchronous(self.cluster, STANDBY_NAME)
        if self.previous is None:
            command.upgrade(alembic_config(self.cluster.url()), "head")
        else:
            self.previous.migrate(self.cluster.url())
        with self.cluster.connect() as conn:
            audit.install(conn)
            with contextlib.suppress(psycopg.Error):  # to read row locks; not everywhere
                conn.execute("CREATE EXTENSION IF NOT EXISTS pgrowlocks")
        common = {
            **TIMINGS,
            "JOB_HANDLERS": "tests.chaos.handlers",
            # The repository (for tests.chaos.handlers) ahead of whatever the caller put there.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "CHAOS_LOG_DIR": str(self.exec_dir),
            "LOG_LEVEL": "info",
        }
        worker_env = {
            **common,
            "WORKER_PROCESSES": str(WORKER_PROCESSES),
            "WORKERS": str(self._slots),
            "QUEUES": QUEUES,
            "KEY_CONCURRENCY": f"*:{KEY_LIMIT}",
            "TYPE_CONCURRENCY": f"{TYPE_LIMIT[0]}:{TYPE_LIMIT[1]}",
            **{
                name: f"{retention_ages(self.retention)[status]:g}s"
                for name, status in RETENTION_VARIABLES.items()
            },
        }
        head = [
            *(
                self._add(f"api-{i}", "jobqueue-api", "HTTP_ADDR", common)
                for i in range(self._apis)
            ),
            *(
                self._add(f"worker-{i}", "jobqueue-worker", "METRICS_ADDR", worker_env)
                for i in range(self._workers)
            ),
        ]
        if self.previous is None:
            self.services += head
        else:
            self.staged += head
            apis, workers = self._previous_counts
            for i in range(apis):
                self.services.append(self._previous("api", i, "HTTP_ADDR", common))
            for i in range(workers):
                self.services.append(self._previous("worker", i, "METRICS_ADDR", worker_env))
        for service in self.services:
            self.launch(service)

    def _previous(self, kind: str, i: int, addr_var: str, env: dict[str, str]) -> Service:
        """A service of the previous release: its own tree's code ahead of the head's."""
        previous = self.previous
        assert previous is not None
        command = f"jobqueue-{kind}"
        service = self._add(f"{kind}-prev-{i}", command, addr_var, {**env, **previous.env()})
        service.argv = previous.argv(command)
        service.release = previous.commit
        return service

    def _add(self, name: str, command: str, addr_var: str, env: dict[str, str]) -> Service:
        proxy = Proxies([self.cluster] if self.standby is None else [self.cluster, self.standby])
        port = free_port()
        env = {
            **env,
            "DATABASE_URL": proxy.database_url(),
            addr_var: f"127.0.0.1:{port}",
        }
        return Service(name, command, port, proxy, env)

    def launch_staged(self) -> list[Service]:
        """Start the staged (head) services, now in service beside whatever runs."""
        staged, self.staged = self.staged, []
        for service in staged:
            self.services.append(service)
            self.launch(service)
        return staged

    def retire(self, service: Service) -> None:
        """Take `service` out of service for good (it has been stopped)."""
        self.services.remove(service)
        self.retired.append(service)

    def launch(self, service: Service) -> Process:
        """Start a new incarnation of `service`."""
        n = len(service.incarnations)
        env = dict(service.env)
        if service.is_worker:
            # Inside the run directory, so even a SIGKILLed worker leaves nothing behind.
            metrics = self.run_dir / "metrics" / f"{service.name}.{n}"
            metrics.mkdir(parents=True)
            env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics)
        log = self.logs_dir / f"{service.name}.{n}.log"
        process = Process(service.command, env, log, service.argv)
        service.incarnations.append(process)
        return process

    def close(self) -> None:
        """Kill whatever still runs and stop the cluster; idempotent, never raises."""
        for service in [*self.services, *self.staged, *self.retired]:
            for process in service.incarnations:
                if process.alive():
                    with contextlib.suppress(Exception):
                        process.kill_group()  # SIGKILL also ends a stopped process
            with contextlib.suppress(Exception):
                service.proxy.close()
        with contextlib.suppress(Exception):
            self.http.close()
        if self._observer is not None:
            with contextlib.suppress(Exception):
                self._observer.close()
        for cluster in (self.cluster, self.standby):
            if cluster is not None:
                with contextlib.suppress(Exception):
                    cluster.cleanup()

    # --- observation ------------------------------------------------------------------

    @property
    def apis(self) -> list[Service]:
        return [s for s in self.services if not s.is_worker]

    @property
    def workers(self) -> list[Service]:
        return [s for s in self.services if s.is_worker]

    def ready(self, service: Service, http: httpx.Client | None = None) -> bool:
        if not service.incarnations or not service.current.alive():
            return False
        try:
            ok = (http or self.http).get(service.url("/readyz")).status_code == 200
        except httpx.HTTPError:
            return False
        if ok and service.is_worker:
            return len(service.current.working_children()) == WORKER_PROCESSES
        return ok

    def all_ready(self) -> bool:
        return all(self.ready(s) for s in self.services)

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run `sql` on a direct connection (never through a proxy); reconnects after faults."""
        for attempt in range(2):
            try:
                if self._observer is None or self._observer.closed:
                    self._observer = self.cluster.connect()
                return self._observer.execute(sql, params).fetchall()
            except psycopg.OperationalError:
                if self._observer is not None:
                    with contextlib.suppress(Exception):
                        self._observer.close()
                self._observer = None
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def execution_records(self) -> Iterator[dict[str, Any]]:
        for path in sorted(self.exec_dir.glob("*.jsonl")):
            for line in path.read_text().splitlines():
                if line.strip():
                    yield json.loads(line)

    def service_log_lines(self) -> Iterator[tuple[str, str]]:
        """(file name, line) for every line any service incarnation wrote."""
        for path in sorted(self.logs_dir.glob("*.log")):
            for line in path.read_text(errors="replace").splitlines():
                if line.strip():
                    yield path.name, line


def wait_until(predicate: Any, timeout: float, interval: float = 0.1) -> float | None:
    """Poll until `predicate()` is truthy; the time.time() it was, or None after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return time.time()
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)
