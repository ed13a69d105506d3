"""The Procrastinate app its workers load (`procrastinate --app=...app worker`): one no-op task."""

from __future__ import annotations

import os

from procrastinate import App, PsycopgConnector

from bench.beacon import report

app = App(connector=PsycopgConnector(conninfo=os.environ.get("BENCH_PROCRASTINATE_DSN", "")))


@app.task(name="noop")
async def noop(m: str | None = None, p: int = 0) -> None:
    if m:
        report(m, p)
