"""`make bench-api`: POST /jobs CPU, throughput and latency of a real `jobqueue-api` process,
against an empty handler measured in the same run.

Creates a throwaway database on the local PostgreSQL (or BENCH_DATABASE_URL's
server), migrates it, starts `jobqueue-api` with its default settings on a free
port, and loads it from this process: C keep-alive connections, each sending
`POST /jobs` back to back for D seconds. The client is a few lines of raw
HTTP/1.1 on asyncio so that it costs far less CPU than the server it measures.
Afterwards the job count in the database must equal the number of 201s.

Each run is repeated against an empty handler (`--serve-empty`: a Starlette POST route
that reads the body and answers a small JSON document, on Hypercorn with the API's own
configuration), started alongside the API: the ratio of the two processes' CPU per
request (from /proc, which depends much less on how busy the machine is than the rates
do) is what the API itself adds to HTTP. Every concurrency is run `--repeats` times,
interleaved, and the medians are reported (the ratio: the median of the pairs' ratios).

    python -m bench.api [--concurrency 8 16 32] [--duration 10] [--repeats 3]
                        [--idempotency-keys] [--max-pending 1000000] [--api-processes 2]
                        [--profile]

`--max-pending` starts the API with that MAX_PENDING (admission control), to measure what
the depth check costs per request; a cap the run reaches measures the 429 path instead.
`--profile` adds one unmeasured run at 16 clients with `py-spy` (`make bench-install`)
sampling the API, and splits its CPU per request by area (raw samples in bench-results/).
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

from bench import profile, webhooks

ROOT = Path(__file__).resolve().parent.parent
BODY = b'{"type":"sleep","payload":{"duration":"1s","note":"bench"}}'
PROFILE_CLIENTS = 16
PROFILE_RATE = 250  # samples per second


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
    """User + system CPU time of a process and its children so far (Linux /proc): with
    API_PROCESSES > 1 the API's processes are the children of the one started."""
    return webhooks.cpu_seconds([pid, *profile.children(pid)])


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
    url: str,
    port: int,
    log_path: Path,
    max_pending: str | None,
    empty: bool = False,
    api_processes: int = 1,
) -> subprocess.Popen[bytes]:
    """`jobqueue-api`, or with `empty` this module's empty handler, on `port`."""
    env = {**os.environ, "DATABASE_URL": url, "HTTP_ADDR": f"127.0.0.1:{port}"}
    env.pop("MAX_PENDING", None)
    env.pop("API_PROCESSES", None)
    if max_pending is not None:
        env["MAX_PENDING"] = max_pending
    if api_processes > 1 and not empty:
        env["API_PROCESSES"] = str(api_processes)
    argv = [str(ROOT / ".venv" / "bin" / "jobqueue-api")]
    if empty:
        env["PYTHONPATH"] = str(ROOT)
        argv = [sys.executable, "-m", "bench.api", "--serve-empty"]
    with log_path.open("wb") as log:
        return subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def serve_empty() -> None:
    """The empty handler: `POST /jobs` reads the body and answers 201 with a small JSON
    document; `/readyz` answers 200. Hypercorn is configured as `jobqueue-api` configures
    it (HTTP_ADDR from the environment); no database, no middleware, no access log."""
    from hypercorn.asyncio import serve
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from jobcore.settings import load_api_settings
    from jobqueue_api.main import hypercorn_config

    async def submit(request: Request) -> Response:
        await request.body()
        return Response(b'{"id":"0"}', status_code=201, media_type="application/json")

    async def ready(request: Request) -> Response:
        return Response(b'{"status":"ready"}', media_type="application/json")

    app = Starlette(routes=[Route("/jobs", submit, methods=["POST"]), Route("/readyz", ready)])
    config = hypercorn_config(load_api_settings())
    asyncio.run(serve(app, config))  # type: ignore[arg-type]  # ASGI app, other protocol


async def _wait_ready(port: int, proc: subprocess.Popen[bytes], limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with status {proc.returncode} at startup")
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
    raise TimeoutError(f"{proc.args!r} did not become ready")


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = _server_url()
    name = f"jq_apibench_{os.getpid()}"
    admin = await asyncpg.connect(server)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = _with_database(server, name)
    proc: subprocess.Popen[bytes] | None = None
    empty: subprocess.Popen[bytes] | None = None
    log_path = ROOT / "bench-results" / f"api-{name}.log"
    log_path.parent.mkdir(exist_ok=True)
    try:
        config = Config(str(ROOT / "alembic.ini"))
        config.set_main_option("script_location", str(ROOT / "migrations"))
        config.attributes["database_url"] = url
        config.attributes["skip_logging"] = True
        await asyncio.to_thread(command.upgrade, config, "head")  # env.py runs its own loop
        port, empty_port = _free_port(), _free_port()
        proc = _start_api(url, port, log_path, args.max_pending, api_processes=args.api_processes)
        empty = _start_api(url, empty_port, log_path.with_suffix(".empty.log"), None, True)
        await _wait_ready(port, proc)
        await _wait_ready(empty_port, empty)
        # Warm-up: pools, caches.
        await load(port, 4, 2.0, args.idempotency_keys, proc.pid)
        await load(empty_port, 4, 1.0, False, empty.pid)
        jobs_before = await _job_count(url)
        repeats: dict[int, list[dict[str, Any]]] = {c: [] for c in args.concurrency}
        for _ in range(args.repeats):
            for c in args.concurrency:
                # Back to back, so both see about the same machine.
                api = await load(port, c, args.duration, args.idempotency_keys, proc.pid)
                bare = await load(empty_port, c, args.duration, False, empty.pid)
                api["empty_cpu_ms_per_request"] = bare["server_cpu_ms_per_request"]
                api["empty_p99_ms"] = bare["p99_ms"]
                api["cpu_ratio_to_empty"] = round(
                    api["server_cpu_ms_per_request"] / bare["server_cpu_ms_per_request"], 2
                )
                repeats[c].append(api)
        created = sum(r["statuses"].get("201", 0) for reps in repeats.values() for r in reps)
        runs = [_median_run(reps) for reps in repeats.values()]
        stored = await _job_count(url) - jobs_before
        if stored != created:
            raise AssertionError(f"{created} jobs acknowledged with 201 but {stored} stored")
        result: dict[str, Any] = {
            "what": "POST /jobs against one jobqueue-api process (default settings), "
            "and against an empty Starlette handler on the same Hypercorn configuration",
            "idempotency_keys": args.idempotency_keys,
            "max_pending": args.max_pending,
            "api_processes": args.api_processes,
            "cpus": os.cpu_count(),
            "load_average_before": os.getloadavg(),
            "runs": runs,
        }
        if args.profile:
            result["profile"] = await _profile(port, proc.pid, args)
        return result
    finally:
        _stop(proc)
        _stop(empty)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


_MEDIANS = (
    "throughput_rps",
    "p50_ms",
    "p99_ms",
    "mean_ms",
    "max_ms",
    "server_cpu_ms_per_request",
    "empty_cpu_ms_per_request",
    "empty_p99_ms",
    "cpu_ratio_to_empty",
)


def _median_run(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """One concurrency's figures: the median of each over its repeats (the ratio: the median
    of the repeats' ratios, each from one back-to-back pair), the repeats kept as they were."""
    statuses: dict[str, int] = {}
    for r in reps:
        for status, n in r["statuses"].items():
            statuses[status] = statuses.get(status, 0) + n
    return {
        "concurrency": reps[0]["concurrency"],
        "requests": sum(r["requests"] for r in reps),
        "statuses": statuses,
        **{key: round(statistics.median(r[key] for r in reps), 3) for key in _MEDIANS},
        "repeats": reps,
    }


# --- profile -----------------------------------------------------------------------

# Where a sample's CPU goes, by the frames of its stack: the first of these areas any
# frame falls in (logging before JSON, SQLAlchemy before asyncpg), else the package of
# the innermost frame that has one.
_HELD_AREAS = [
    ("logging (access log, submit line)", ("logging/__init__.py", "jobcore/logs.py")),
    ("metrics", ("prometheus_client/",)),
    ("SQLAlchemy", ("sqlalchemy/",)),
    ("request validation", ("jobqueue_api/validation.py", "jobcore/validation.py")),
    ("JSON", ("json/", "orjson", "jobqueue_api/records.py", "jobcore/record.py")),
]
_INNERMOST = [
    ("asyncpg", "asyncpg/"),
    ("Hypercorn and h11 (HTTP)", "hypercorn/"),
    ("Hypercorn and h11 (HTTP)", "h11/"),
    ("Starlette (routing, request, response)", "starlette/"),
    ("jobqueue_api (middleware, routes, calls)", "jobqueue_api/"),
    ("jobcore", "jobcore/"),
    ("asyncio event loop", "asyncio/"),
]
_IDLE = ("select (selectors.py", "epoll")


def _area(frames: list[str]) -> str:
    if any(idle in frames[-1] for idle in _IDLE):
        return "idle"
    for area, needles in _HELD_AREAS:
        if any(needle in frame for frame in frames for needle in needles):
            return area
    for frame in reversed(frames):
        for area, needle in _INNERMOST:
            if needle in frame:
                return area
    return "other (interpreter, uuid, stdlib)"


def summarize(raw: Path, cpu_ms_per_request: float) -> dict[str, Any]:
    """Busy samples of `raw` (py-spy's raw format) by area, as ms of CPU per request."""
    areas: dict[str, int] = {}
    own: dict[str, int] = {}
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        area = _area(frames)
        if area == "idle":
            continue
        areas[area] = areas.get(area, 0) + int(count)
        own[frames[-1].strip()] = own.get(frames[-1].strip(), 0) + int(count)
    busy = sum(areas.values()) or 1
    ranked = sorted(areas.items(), key=lambda kv: -kv[1])
    top = sorted(own.items(), key=lambda kv: -kv[1])[:15]
    return {
        "busy_samples": busy,
        "cpu_ms_per_request": cpu_ms_per_request,
        "areas_ms_per_request": {k: round(v / busy * cpu_ms_per_request, 3) for k, v in ranked},
        "top_self_pct": {k: round(v / busy * 100, 1) for k, v in top},
    }


def _sample(spy: Path, pid: int, raw: Path) -> subprocess.Popen[bytes]:
    argv = [str(spy), "record", "--nonblocking", "-p", str(pid), "-r", str(PROFILE_RATE)]
    argv += ["-f", "raw", "-o", str(raw)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def _profile(port: int, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    """One more run at PROFILE_CLIENTS clients, not measured, with py-spy sampling the API."""
    spy = ROOT / ".venv" / "bin" / "py-spy"
    if not spy.exists():
        raise RuntimeError("--profile needs py-spy: make bench-install")
    raw = ROOT / "bench-results" / f"api-profile-{time.strftime('%Y%m%dT%H%M%SZ')}.txt"
    sampler = _sample(spy, pid, raw)
    try:
        await asyncio.sleep(1.0)  # py-spy attaches
        run = await load(port, PROFILE_CLIENTS, args.duration, args.idempotency_keys, pid)
    finally:
        sampler.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        await asyncio.to_thread(sampler.wait, 30)
    summary = summarize(raw, run["server_cpu_ms_per_request"])
    summary["raw"] = str(raw.relative_to(ROOT))
    return summary


async def _job_count(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM jobqueue.jobs"))
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument(
        "--repeats", type=int, default=3, help="interleaved repeats; medians are reported"
    )
    parser.add_argument("--idempotency-keys", action="store_true", help="a unique key per job")
    parser.add_argument("--max-pending", help="MAX_PENDING for the API (default: unset)")
    parser.add_argument(
        "--api-processes", type=int, default=1, help="API_PROCESSES for the API (default 1)"
    )
    parser.add_argument("--profile", action="store_true", help="py-spy the API, one more run")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--serve-empty", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_empty:
        serve_empty()
        return
    result = asyncio.run(run(args))
    print(f"load average before: {result['load_average_before']}")
    print(f"MAX_PENDING: {result['max_pending'] or 'unset'}")
    print(f"API_PROCESSES: {result['api_processes']} (the empty handler: 1)")
    print(
        f"{'conc':>5} {'requests':>9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
        f" {'API CPU ms/req':>15} {'empty ms/req':>13} {'API/empty':>10}"
    )
    for r in result["runs"]:
        print(
            f"{r['concurrency']:>5} {r['requests']:>9} {r['throughput_rps']:>8} "
            f"{r['p50_ms']:>8} {r['p99_ms']:>8} {r['max_ms']:>8}"
            f" {r['server_cpu_ms_per_request']:>15} {r['empty_cpu_ms_per_request']:>13}"
            f" {r['cpu_ratio_to_empty']:>10}  statuses {r['statuses']}"
        )
    at16 = [r for r in result["runs"] if r["concurrency"] == PROFILE_CLIENTS]
    if at16:
        r = at16[0]
        print(
            f"at {PROFILE_CLIENTS} clients: API/empty CPU {r['cpu_ratio_to_empty']} "
            f"(target <= 1.5), p99 {r['p99_ms']} ms (target <= 25)"
        )
    if "profile" in result:
        profile = result["profile"]
        print(f"profile at {PROFILE_CLIENTS} clients ({profile['raw']}), ms of CPU per request:")
        for area, ms in profile["areas_ms_per_request"].items():
            print(f"  {ms:>7.3f}  {area}")
    out = args.json or ROOT / "bench-results" / f"api-{time.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"written to {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
