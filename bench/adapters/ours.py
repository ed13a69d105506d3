"""Our queue: `jobqueue-worker` (WORKER_PROCESSES x WORKERS) and one `jobqueue-api` process.

Bulk enqueue goes straight to `jobcore.store.submit_many` (as the peers' bulk
calls go straight to their tables); single submits go through `POST /jobs` on
the real API, as a client would.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import pg
from bench.adapters.base import Sql, Unsupported, wait_until
from bench.adapters.ours_jobs import JOB_TYPE
from bench.http import Connection, Pool, get_status
from bench.procs import BIN, ROOT, free_port, start, stop
from jobcore import store
from jobcore.db import make_engine
from jobcore.ids import new_id
from jobcore.rows import NewJob

HANDLERS = "bench.adapters.ours_jobs"
MAX_ATTEMPTS = 5
# Jobs per submit_many statement: bounded so one huge bind array does not dominate memory.
ENQUEUE_CHUNK = 10_000


class Ours:
    name = "jobqueue"

    def __init__(self, server: str, workdir: Path, workers: int) -> None:
        self.server = server
        self.workdir = workdir
        self.workers = workers
        self.database = pg.database_name("jobqueue")
        self.url = ""
        self.sql = Sql()
        self.engine: Any = None
        self.worker_procs: list[subprocess.Popen[bytes]] = []
        self.api_proc: subprocess.Popen[bytes] | None = None
        self.api_port = 0
        self.api: Pool | None = None
        self.metrics_port = 0
        # A queue a run keeps paused, whose jobs are not waited for (`remaining`).
        self.held: str | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "version": importlib.metadata.version("jobqueue"),
            "settings": {
                "WORKERS": self.workers,
                "other settings": "defaults (POLL_INTERVAL 1s, LOG_LEVEL info, ...)",
                "api_processes": 1,
                "bulk enqueue": "store.submit_many + store.notify in one transaction",
                "single submit": "POST /jobs over HTTP/1.1 keep-alive",
            },
        }

    def env(self) -> dict[str, str]:
        return {"DATABASE_URL": self.url, "JOB_HANDLERS": HANDLERS}

    async def prepare(self) -> None:
        self.url = await pg.create(self.server, self.database)
        migrate = await asyncio.create_subprocess_exec(
            str(BIN / "alembic"),
            "upgrade",
            "head",
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **self.env()},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await migrate.communicate()
        if migrate.returncode != 0:
            raise RuntimeError(f"alembic upgrade head failed:\n{output.decode()}")
        self.engine = make_engine(self.url, pool_size=2, application_name="jobqueue-bench")
        await self.sql.open(self.url)

    async def cleanup(self) -> None:
        await self.stop_workers()
        await self.stop_api()
        await self.sql.close()
        if self.engine is not None:
            await self.engine.dispose()
            self.engine = None
        await pg.drop(self.server, self.database)

    # --- processes ---------------------------------------------------------------

    async def start_workers(self, processes: int, **extra_env: str) -> None:
        self.metrics_port = free_port()
        log = self.workdir / "jobqueue-worker.log"
        env = {
            **self.env(),
            "WORKER_PROCESSES": str(processes),
            "WORKERS": str(self.workers),
            "METRICS_ADDR": f"127.0.0.1:{self.metrics_port}",
            **extra_env,
        }
        self.worker_procs = [start([str(BIN / "jobqueue-worker")], env, log)]

        async def ready() -> bool:
            return await get_status("127.0.0.1", self.metrics_port, "/readyz") == 200

        await wait_until(ready, 60, "jobqueue-worker /readyz", self.worker_procs, log)

    async def stop_workers(self) -> None:
        await asyncio.to_thread(stop, self.worker_procs)
        self.worker_procs = []

    async def start_api(self, **extra_env: str) -> None:
        self.api_port = free_port()
        log = self.workdir / "jobqueue-api.log"
        env = {**self.env(), "HTTP_ADDR": f"127.0.0.1:{self.api_port}", **extra_env}
        self.api_proc = start([str(BIN / "jobqueue-api")], env, log)

        async def ready() -> bool:
            return await get_status("127.0.0.1", self.api_port, "/readyz") == 200

        await wait_until(ready, 60, "jobqueue-api /readyz", [self.api_proc], log)
        self.api = Pool("127.0.0.1", self.api_port)

    async def stop_api(self) -> None:
        if self.api is not None:
            await self.api.close()
            self.api = None
        if self.api_proc is not None:
            await asyncio.to_thread(stop, [self.api_proc])
            self.api_proc = None

    def worker_log_size(self) -> int:
        """Where the worker's log ends now: `outages_since` counts from there."""
        log = self.workdir / "jobqueue-worker.log"
        return log.stat().st_size if log.exists() else 0

    def outages_since(self, offset: int) -> int:
        """How often the worker logged losing the database after `offset`: a connection cut
        from outside (e.g. `pg_terminate_backend`) voids what was measured meanwhile."""
        with (self.workdir / "jobqueue-worker.log").open("rb") as log:
            log.seek(offset)
            return log.read().count(b'"msg": "database unavailable"')

    async def completed_total(self) -> float:
        """jobs_completed_total from the worker's /metrics (cheap: no database query)."""
        return await self.metric("jobs_completed_total")

    async def metric(self, name: str) -> float:
        """An unlabelled counter or gauge from the worker's /metrics (0 if not exposed)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.metrics_port)
        conn = Connection(reader, writer)
        try:
            _, body = await conn.request("GET", "/metrics")
        finally:
            conn.close()
        for line in body.decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
        return 0.0

    # --- operations --------------------------------------------------------------

    async def enqueue_many(self, n: int) -> None:
        await self.insert([NewJob(new_id(), JOB_TYPE, {}, MAX_ATTEMPTS) for _ in range(n)])

    async def insert(self, jobs: Sequence[NewJob]) -> None:
        """Insert prepared jobs (any queue, priority, run_at) in one transaction; wake workers."""
        async with self.engine.begin() as conn:
            for i in range(0, len(jobs), ENQUEUE_CHUNK):
                await store.submit_many(conn, jobs[i : i + ENQUEUE_CHUNK])
            await store.notify(conn)

    async def submit(self, payload: dict[str, Any]) -> None:
        if self.api is None:
            await self.start_api()
        assert self.api is not None
        body = json.dumps({"type": JOB_TYPE, "payload": payload}).encode()
        status, answer = await self.api.request("POST", "/jobs", body)
        if status != 201:
            raise RuntimeError(f"POST /jobs answered {status}: {answer[:200]!r}")

    async def submit_many(self, body: bytes) -> int:
        """POST /jobs/batch with a prepared body; returns the number of jobs created."""
        if self.api is None:
            await self.start_api()
        assert self.api is not None
        status, answer = await self.api.request("POST", "/jobs/batch", body)
        if status in (404, 405):
            raise Unsupported("POST /jobs/batch is not served by this jobqueue-api")
        if status != 200:
            raise RuntimeError(f"POST /jobs/batch answered {status}: {answer[:200]!r}")
        results = json.loads(answer)["results"]
        return sum(1 for item in results if item["status"] == "created")

    async def remaining(self) -> int:
        # Two counts, so each reads its partial index instead of the whole table; the jobs
        # of a queue left paused on purpose (`held`) are not waited for.
        held = f" AND queue <> '{self.held}'" if self.held else ""
        return int(
            await self.sql.value(
                f"SELECT (SELECT count(*) FROM jobqueue.jobs WHERE status = 'pending'{held})"
                " + (SELECT count(*) FROM jobqueue.jobs WHERE status = 'processing')"
            )
        )

    async def last_completion(self) -> float:
        return float(
            await self.sql.value(
                f"SELECT extract(epoch FROM max(updated_at)) FROM {pg.RETAINED}"
                " WHERE status = 'completed'"
            )
        )
