"""Procrastinate at its defaults: `procrastinate worker` processes (PsycopgConnector).

Bulk enqueue is `batch_defer_async`, a single submit `defer_async`, both through
an App opened in the benchmark process on the same database.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import subprocess
from pathlib import Path
from typing import Any

from procrastinate import App, PsycopgConnector

from bench import pg
from bench.adapters.base import Sql, wait_until
from bench.procs import BIN, start, stop

APP = "bench.adapters.procrastinate_app.app"


class Procrastinate:
    name = "procrastinate"

    def __init__(self, server: str, workdir: Path) -> None:
        self.server = server
        self.workdir = workdir
        self.database = pg.database_name("procrastinate")
        self.url = ""
        self.sql = Sql()
        self.app: App | None = None
        self.procs: list[subprocess.Popen[bytes]] = []

    def describe(self) -> dict[str, Any]:
        return {
            "version": importlib.metadata.version("procrastinate"),
            "settings": {
                "worker": "procrastinate worker, defaults (concurrency 1, listen_notify on)",
                "connector": "PsycopgConnector",
                "bulk enqueue": "Task.batch_defer_async",
                "single submit": "Task.defer_async",
            },
        }

    async def prepare(self) -> None:
        self.url = await pg.create(self.server, self.database)
        self.app = App(connector=PsycopgConnector(conninfo=self.url))
        await self.app.open_async()
        await self.app.schema_manager.apply_schema_async()
        await self.sql.open(self.url)

    async def cleanup(self) -> None:
        await self.stop_workers()
        await self.sql.close()
        if self.app is not None:
            await self.app.close_async()
            self.app = None
        await pg.drop(self.server, self.database)

    async def start_workers(self, processes: int) -> None:
        log = self.workdir / "procrastinate.log"
        env = {"BENCH_PROCRASTINATE_DSN": self.url}
        argv = [str(BIN / "procrastinate"), f"--app={APP}", "worker"]
        self.procs = [start(argv, env, log) for _ in range(processes)]

        async def registered() -> bool:
            count = await self.sql.value("SELECT count(*) FROM procrastinate_workers")
            return int(count) >= processes

        await wait_until(registered, 60, "procrastinate workers", self.procs, log)

    async def stop_workers(self) -> None:
        await asyncio.to_thread(stop, self.procs)
        self.procs = []

    def _task(self) -> Any:
        assert self.app is not None
        return self.app.configure_task(name="noop")

    async def enqueue_many(self, n: int) -> None:
        await self._task().batch_defer_async(*({} for _ in range(n)))

    async def submit(self, payload: dict[str, Any]) -> None:
        await self._task().defer_async(**payload)

    async def remaining(self) -> int:
        return int(
            await self.sql.value(
                "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
            )
        )

    async def last_completion(self) -> float:
        return float(
            await self.sql.value(
                "SELECT extract(epoch FROM max(at)) FROM procrastinate_events"
                " WHERE type = 'succeeded'"
            )
        )
