"""`make bench-api`: POST /jobs throughput and latency of a real `jobqueue-api` process.

Creates a throwaway database on the local PostgreSQL (or BENCH_DATABASE_URL's
server), migrates it, starts `jobqueue-api` with its default settings on a free
port, and loads it from this process: C keep-alive connections, each sending
`POST /jobs` back to back for D seconds. The client is a few lines of raw
HTTP/1.1 on asyncio so that it costs far less CPU than the server it measures.
Afterwards the job count in the database must equal the number of 201s.

    python -m bench.api [--concurrency 8 32] [--duration 10] [--idempotency-keys]
                        [--max-pending 1000000]

`--max-pending` starts the API with that MAX_PENDING (admission control), to measure what
the depth check costs per request; a cap the run reaches measures the 429 path instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
from alembic import command
from alembic.config import Config

ROOT = Path(__file__).resolve().parent.parent
BODY = b'{"type":"sleep","payload":{"duration":"1s","note":"bench"}}'


def _server_url() -> str:
    url = os.environ.get("BENCH_DATABASE_URL")
    if url:
        return url
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "devdb.py"), "test-url"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def _with_database(url: str, name: str) -> str:
    head, _, query = url.partition("?")
    base = head.rsplit("/", 1)[0]
    return f"{base}/{name}" + (f"?{query}" if query else "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class Client:
    """One keep-alive HTTP/1.1 connection that sends POST /jobs and reads the status."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Client:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def post_job(self, key: str | None) -> int | None:
        """The answer's status, or None when the server had closed the connection (Hypercorn
        closes a keep-alive connection after 1,000 requests)."""
        extra = f"Idempotency-Key: {key}\r\n" if key else ""
        head = (
            f"POST /jobs HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"{extra}Content-Length: {len(BODY)}\r\n\r\n"
        )
        self.writer.write(head.encode() + BODY)
        status_line = await self.reader.readline()
        if not status_line:
            return None
        status = int(status_line.split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        self.writer.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(
    port: int, concurrency: int, duration: float, keys: bool, pid: int
) -> dict[str, Any]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    stop_at = time.monotonic() + duration

    async def worker(n: int) -> None:
        client = await Client.open(port)
        i = 0
        try:
            while time.monotonic() < stop_at:
                key = f"bench-{os.getpid()}-{concurrency}-{n}-{i}" if keys else None
                started = time.perf_counter()
                status = await client.post_job(key)
                if status is None:
                    client.close()
                    client = await Client.open(port)
                    continue
                latencies.append(time.perf_counter() - started)
                statuses[status] = statuses.get(status, 0) + 1
                i += 1
        finally:
            client.close()

    started, cpu_before = time.monotonic(), cpu_seconds(pid)
    await asyncio.gather(*(worker(n) for n in range(concurrency)))
    elapsed, cpu = time.monotonic() - started, cpu_seconds(pid) - cpu_before
    return {
        "concurrency": concurrency,
        "seconds": round(elapsed, 2),
        "requests": len(latencies),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "throughput_rps": round(len(latencies) / elapsed, 1),
        "p50_ms": round(percentile(latencies, 50) * 1000, 2),
        "p99_ms": round(percentile(latencies, 99) * 1000, 2),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 2),
        "max_ms": round(max(latencies) * 1000, 2),
        # Independent of how busy the machine is: the server's own cost per request.
        "server_cpu_ms_per_request": round(cpu / len(latencies) * 1000, 3),
    }


def _start_api(
    url: str, port: int, log_path: Path, max_pending: str | None
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": url, "HTTP_ADDR": f"127.0.0.1:{port}"}
    env.pop("MAX_PENDING", None)
    if max_pending is not None:
        env["MAX_PENDING"] = max_pending
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "jobqueue-api")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def _wait_ready(port: int, proc: subprocess.Popen[bytes], limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jobqueue-api exited with status {proc.returncode} at startup")
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /readyz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            ready = (await reader.readline()).split()[1] == b"200"
            writer.close()
            if ready:
                return
        except (OSError, IndexError):
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError("jobqueue-api did not become ready")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = _server_url()
    name = f"jq_apibench_{os.getpid()}"
    admin = await asyncpg.connect(server)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = _with_database(server, name)
    proc: subprocess.Popen[bytes] | None = None
    log_path = ROOT / "bench-results" / f"api-{name}.log"
    log_path.parent.mkdir(exist_ok=True)
    try:
        config = Config(str(ROOT / "alembic.ini"))
        config.set_main_option("script_location", str(ROOT / "migrations"))
        config.attributes["database_url"] = url
        config.attributes["skip_logging"] = True
        await asyncio.to_thread(command.upgrade, config, "head")  # env.py runs its own loop
        port = _free_port()
        proc = _start_api(url, port, log_path, args.max_pending)
        await _wait_ready(port, proc)
        await load(port, 4, 2.0, args.idempotency_keys, proc.pid)  # warm-up: pools, caches
        jobs_before = await _job_count(url)
        runs = [
            await load(port, c, args.duration, args.idempotency_keys, proc.pid)
            for c in args.concurrency
        ]
        created = sum(r["statuses"].get("201", 0) for r in runs)
        stored = await _job_count(url) - jobs_before
        if stored != created:
            raise AssertionError(f"{created} jobs acknowledged with 201 but {stored} stored")
        return {
            "what": "POST /jobs against one jobqueue-api process (default settings)",
            "idempotency_keys": args.idempotency_keys,
            "max_pending": args.max_pending,
            "cpus": os.cpu_count(),
            "load_average_before": os.getloadavg(),
            "runs": runs,
        }
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def _job_count(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM jobs"))
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--idempotency-keys", action="store_true", help="a unique key per job")
    parser.add_argument("--max-pending", help="MAX_PENDING for the API (default: unset)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(f"load average before: {result['load_average_before']}")
    print(f"MAX_PENDING: {result['max_pending'] or 'unset'}")
    print(
        f"{'conc':>5} {'requests':>9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
        f" {'server CPU ms/req':>18}"
    )
    for r in result["runs"]:
        print(
            f"{r['concurrency']:>5} {r['requests']:>9} {r['throughput_rps']:>8} "
            f"{r['p50_ms']:>8} {r['p99_ms']:>8} {r['max_ms']:>8}"
            f" {r['server_cpu_ms_per_request']:>18}  statuses {r['statuses']}"
        )
    out = args.json or ROOT / "bench-results" / f"api-{time.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"written to {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
