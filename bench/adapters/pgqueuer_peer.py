"""PgQueuer at its defaults: `pgq run` processes (asyncpg, batch size 10, durable tables).

Bulk enqueue is `Queries.enqueue` with lists, a single submit `Queries.enqueue`
with one job, over an asyncpg pool in the benchmark process.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import subprocess
from pathlib import Path
from typing import Any

import asyncpg
from pgqueuer import AsyncpgPoolDriver, Queries

from bench import pg
from bench.adapters.base import Sql
from bench.procs import BIN, start, stop


class PgQueuerPeer:
    name = "pgqueuer"

    def __init__(self, server: str, workdir: Path) -> None:
        self.server = server
        self.workdir = workdir
        self.database = pg.database_name("pgqueuer")
        self.url = ""
        self.sql = Sql()
        self.pool: asyncpg.Pool | None = None
        self.queries: Queries | None = None
        self.procs: list[subprocess.Popen[bytes]] = []

    def describe(self) -> dict[str, Any]:
        return {
            "version": importlib.metadata.version("pgqueuer"),
            "settings": {
                "worker": "pgq run's defaults: batch_size 10, no concurrency cap, durable tables",
                "driver": "AsyncpgDriver (one connection per worker process)",
                "bulk enqueue": "Queries.enqueue with lists",
                "single submit": "Queries.enqueue",
            },
        }

    async def prepare(self) -> None:
        self.url = await pg.create(self.server, self.database)
        self.pool = await asyncpg.create_pool(self.url, min_size=1, max_size=32)
        self.queries = Queries(AsyncpgPoolDriver(self.pool))
        await self.queries.install()
        await self.sql.open(self.url)

    async def cleanup(self) -> None:
        await self.stop_workers()
        await self.sql.close()
        if self.pool is not None:
            await self.pool.close()
            self.pool = None
        await pg.drop(self.server, self.database)

    async def start_workers(self, processes: int) -> None:
        log = self.workdir / "pgqueuer.log"
        env = {"BENCH_PGQUEUER_DSN": self.url}
        argv = [str(BIN / "python"), "-m", "bench.adapters.pgqueuer_worker"]
        # Readiness is proven by the warm-up jobs the harness sends before measuring.
        self.procs = [start(argv, env, log) for _ in range(processes)]

    async def stop_workers(self) -> None:
        await asyncio.to_thread(stop, self.procs)
        self.procs = []

    async def enqueue_many(self, n: int) -> None:
        assert self.queries is not None
        await self.queries.enqueue(["noop"] * n, [None] * n, [0] * n)

    async def submit(self, payload: dict[str, Any]) -> None:
        assert self.queries is not None
        await self.queries.enqueue("noop", json.dumps(payload).encode())

    async def remaining(self) -> int:
        return int(await self.sql.value("SELECT count(*) FROM pgqueuer"))

    async def last_completion(self) -> float:
        return float(
            await self.sql.value(
                "SELECT extract(epoch FROM max(created)) FROM pgqueuer_log"
                " WHERE status = 'successful'"
            )
        )
