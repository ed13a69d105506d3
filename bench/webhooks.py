"""`make bench-webhooks`: webhook jobs per second of real worker processes against a local sink.

    python -m bench.webhooks [--quick] [--jobs N] [--repeat R] [--processes 1] [--workers 8]

A fresh database and a real `jobqueue-worker` (WORKER_PROCESSES, WORKERS job
slots, WEBHOOK_ALLOW_PRIVATE=true, JOB_TIMEOUT 5s) deliver `webhook` jobs,
inserted straight into the table, to a sink on 127.0.0.1 that answers every
POST with 200 at once. Each repeat: a warm-up drain (the first webhook builds
the process's connection pool), then a measured drain of `--jobs` jobs. Reported:
jobs/s (first insert to last completion), the CPU the worker's job-running
processes used per webhook (from /proc), the connections the sink accepted
during the measured drain (0: the warm-up's are reused), and retries, which
must be none. Table on stdout, JSON in
bench-results/webhooks-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import pg, procs, profile
from bench.adapters.base import to_the_end, wait_until
from bench.adapters.ours import Ours
from bench.procs import ROOT
from bench.stats import median
from jobcore import store
from jobcore.ids import new_id
from jobcore.rows import NewJob

TARGET_PER_PROCESS = 500.0  # webhooks/s per worker process
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Config:
    jobs: int = 5_000
    warmup: int = 200
    repeat: int = 3
    processes: int = 1
    workers: int = 8
    server: str = ""
    output_dir: str = str(ROOT / "bench-results")


QUICK = {"jobs": 600, "warmup": 50, "repeat": 1}


class Sink(asyncio.Protocol):
    """HTTP/1.1 keep-alive: answers each request 200 with an empty body, counts them."""

    requests = 0
    connections = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.buffer = b""
        Sink.connections += 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            length = 0
            for line in self.buffer[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            Sink.requests += 1
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time the processes have used so far."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _CLOCK_TICKS


async def enqueue(ours: Ours, url: str, n: int) -> None:
    jobs = [
        NewJob(new_id(), "webhook", {"url": url, "body": {"event": "bench", "n": i}}, 5)
        for i in range(n)
    ]
    async with ours.engine.begin() as conn:
        await store.submit_many(conn, jobs)
        await store.notify(conn)


async def drain(ours: Ours, url: str, n: int, pids: list[int]) -> dict[str, Any]:
    requests, connections = Sink.requests, Sink.connections
    cpu = cpu_seconds(pids)
    started = time.time()
    await enqueue(ours, url, n)

    async def done() -> bool:
        return await ours.remaining() == 0

    await wait_until(done, 60 + n / 20, "the webhook drain", ours.worker_procs, interval=0.05)
    elapsed = await ours.last_completion() - started
    used = cpu_seconds(pids) - cpu
    return {
        "jobs": n,
        "jobs_per_s": n / elapsed,
        "worker_cpu_us_per_job": used / n * 1e6,
        "sink_requests": Sink.requests - requests,
        "sink_new_connections": Sink.connections - connections,
    }


async def session(
    server: str, workdir: Path, url: str, jobs: int, warmup: int, processes: int, workers: int
) -> dict[str, Any]:
    """Fresh database, a warmed-up worker, one measured drain of `jobs` webhooks to `url`."""
    ours = Ours(server, workdir, workers)
    try:
        await ours.prepare()
        await ours.start_workers(processes, WEBHOOK_ALLOW_PRIVATE="true", JOB_TIMEOUT="5s")
        pids = profile.worker_children(ours.worker_procs[0].pid)
        await drain(ours, url, warmup, pids)
        figures = await drain(ours, url, jobs, pids)
        figures["retries"] = int(
            await ours.sql.value(f"SELECT count(*) FROM {pg.RETAINED} WHERE attempts > 1")
        )
        figures["not_completed"] = int(
            await ours.sql.value(f"SELECT count(*) FROM {pg.RETAINED} WHERE status <> 'completed'")
        )
        return {"processes": processes, "workers": workers, **figures}
    finally:
        await to_the_end(ours.cleanup())


async def open_sink() -> tuple[asyncio.Server, str]:
    """The sink, listening on 127.0.0.1; its server and the URL to send webhooks to."""
    server = await asyncio.get_running_loop().create_server(Sink, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/hook"


async def execute(config: Config) -> list[dict[str, Any]]:
    server, url = await open_sink()
    workdir = Path(tempfile.mkdtemp(prefix="jobqueue-bench-webhooks-"))
    results = []
    try:
        for rep in range(config.repeat):
            print(f"repeat {rep + 1}/{config.repeat}: {config.jobs} webhooks", file=sys.stderr)
            results.append(
                await session(
                    config.server,
                    workdir,
                    url,
                    config.jobs,
                    config.warmup,
                    config.processes,
                    config.workers,
                )
            )
    finally:
        server.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats, retries summed; the target verdict per worker process."""
    processes = results[0]["processes"]
    rate = median([r["jobs_per_s"] for r in results])
    retries = sum(r["retries"] + r["not_completed"] for r in results)
    return {
        "processes": processes,
        "workers": results[0]["workers"],
        "jobs_per_s": rate,
        "jobs_per_s_per_process": rate / processes,
        "worker_cpu_us_per_job": median([r["worker_cpu_us_per_job"] for r in results]),
        "sink_new_connections": max(r["sink_new_connections"] for r in results),
        "retries": sum(r["retries"] for r in results),
        "not_completed": sum(r["not_completed"] for r in results),
        "target_jobs_per_s_per_process": TARGET_PER_PROCESS,
        "target_met": rate / processes >= TARGET_PER_PROCESS and retries == 0,
    }


def lines(summary: dict[str, Any]) -> list[str]:
    """The figures as indented text lines."""
    rows = [
        ("webhook jobs/s", f"{summary['jobs_per_s']:,.0f}"),
        ("per worker process", f"{summary['jobs_per_s_per_process']:,.0f}"),
        ("worker CPU per webhook job", f"{summary['worker_cpu_us_per_job']:,.0f} µs"),
        ("new connections (measured drain)", str(summary["sink_new_connections"])),
        ("retried / not completed", f"{summary['retries']} / {summary['not_completed']}"),
        (
            f"target ≥ {TARGET_PER_PROCESS:.0f}/s per process, no retries",
            "met" if summary["target_met"] else "NOT met",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    return [f"  {name:<{width}}  {value}" for name, value in rows]


def render(config: Config, summary: dict[str, Any]) -> str:
    head = (
        f"Webhook benchmark: {config.processes} worker process(es) x {config.workers} slots, "
        f"{config.jobs} jobs to a local sink, median of {config.repeat}"
    )
    return "\n".join([head, *lines(summary)])


def parse_args(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(
        prog="python -m bench.webhooks", description=__doc__.split("\n")[0]
    )
    d = Config()
    parser.add_argument("--quick", action="store_true", help="few jobs, one repeat")
    parser.add_argument("--jobs", type=int, help=f"webhooks per measured drain (default {d.jobs})")
    parser.add_argument("--repeat", type=int, help=f"repeats, median reported (default {d.repeat})")
    parser.add_argument("--processes", type=int, help=f"WORKER_PROCESSES (default {d.processes})")
    parser.add_argument("--workers", type=int, help=f"WORKERS per process (default {d.workers})")
    parser.add_argument(
        "--server",
        help="PostgreSQL maintenance URL (default $BENCH_DATABASE_URL, else the local server)",
    )
    parser.add_argument("--output-dir", help="where the JSON goes (default bench-results/)")
    args = parser.parse_args(argv)
    config = Config()
    if args.quick:
        for key, value in QUICK.items():
            setattr(config, key, value)
    for key in ("jobs", "repeat", "processes", "workers", "server", "output_dir"):
        value = getattr(args, key)
        if value is not None:
            setattr(config, key, value)
    config.server = config.server or pg.server_url()
    if min(config.jobs, config.repeat, config.processes, config.workers) < 1:
        parser.error("--jobs, --repeat, --processes and --workers must be at least 1")
    return config


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    started = datetime.now(UTC)
    try:
        results = asyncio.run(execute(config))
    except KeyboardInterrupt:
        print("interrupted: services stopped, databases dropped", file=sys.stderr)
        return 130
    summary = summarize(results)
    document = {
        "started": started.isoformat(),
        "finished": datetime.now(UTC).isoformat(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "config": asdict(config) | {"server": "(omitted)"},
        "results": results,
        "summary": summary,
        "process_groups": procs.STARTED,
    }
    out_dir = Path(config.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"webhooks-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(render(config, summary))
    print(f"\nJSON: {path}")
    # A retried or unfinished webhook is a failure; the rate depends on the machine.
    return 0 if summary["retries"] == 0 and summary["not_completed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
