"""What tracing costs: the API's CPU per `POST /jobs` and the worker's drain, with tracing
off, with the `otel` extra absent, and on (exporting to an OTLP sink in this process).

    python -m bench.tracing [--quick] [--repeat R] [--duration S] [--jobs N] [--baseline REF]

"absent" runs the services with every `opentelemetry` import made to fail (a
sitecustomize on PYTHONPATH): it runs as "off" only if off imports nothing, and the two
must cost the same. "on" sets OTEL_EXPORTER_OTLP_ENDPOINT to a sink that answers every
export at once; spans are exported in batches every OTEL_BSP_SCHEDULE_DELAY (the SDK's
5 s). The API is loaded by `bench.api.load` (keep-alive clients posting back to back; the
server's CPU from /proc); the drain is `bench.measure.drain` with 2 worker processes. The
variants are interleaved, `repeat` times; medians. With `--baseline REF`, "before" runs
the services of that commit (a git worktree put first on PYTHONPATH; its schema must be this
one's): what the code that tracing added costs with tracing off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench import costs, step
from bench.adapters.base import to_the_end
from bench.adapters.ours import MAX_ATTEMPTS, Ours
from bench.adapters.ours_jobs import JOB_TYPE
from bench.api import load
from bench.beacon import Receiver
from bench.pg import server_url
from bench.procs import ROOT
from bench.stats import median
from jobcore.ids import new_id
from jobcore.rows import NewJob

VARIANTS = ("off", "absent", "on")
BLOCKER = """import sys
class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _Absent())
"""


class Sink:
    """An OTLP/HTTP endpoint that accepts every export and counts the bytes."""

    def __init__(self) -> None:
        self.received = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                sink.received += len(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def variant_env(variant: str, sink: Sink, blocker: Path, baseline: Path) -> dict[str, str]:
    if variant == "before":
        code = ":".join(str(baseline / d) for d in ("shared", "services/api", "services/worker"))
        return {"PYTHONPATH": f"{code}:{ROOT}"}
    if variant == "on":
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url}
    if variant == "absent":
        return {"PYTHONPATH": f"{blocker}:{ROOT}"}
    return {}


async def api_run(server: str, workdir: Path, env: dict[str, str], seconds: float) -> dict:
    ours = Ours(server, workdir, 1)
    try:
        await ours.prepare()
        await ours.start_api(**env)
        assert ours.api_proc is not None
        await load(ours.api_port, 4, 1.0, False, ours.api_proc.pid)  # warm-up
        return await load(ours.api_port, 8, seconds, False, ours.api_proc.pid)
    finally:
        await to_the_end(ours.cleanup())


async def drain_run(
    server: str, workdir: Path, rx: Receiver, env: dict[str, str], n: int
) -> dict[str, Any]:
    ours = Ours(server, workdir, 50)
    try:
        jobs = [NewJob(new_id(), JOB_TYPE, {}, MAX_ATTEMPTS) for _ in range(n)]
        return await costs.drain_with_cpu(ours, rx, 2, jobs, 120, env)
    finally:
        await to_the_end(ours.cleanup())


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = server_url()
    sink = Sink()
    variants = ("before", *VARIANTS) if args.baseline else VARIANTS
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        "api": {v: [] for v in variants},
        "drain": {v: [] for v in variants},
    }
    with tempfile.TemporaryDirectory(prefix="jq-bench-tracing-") as tmp:
        workdir = Path(tmp)
        blocker = workdir / "blocker"
        blocker.mkdir()
        (blocker / "sitecustomize.py").write_text(BLOCKER)
        baseline = workdir / "baseline"
        if args.baseline:
            git = ["git", "-C", str(ROOT), "worktree"]
            await asyncio.to_thread(
                subprocess.run, [*git, "add", "--detach", str(baseline), args.baseline], check=True
            )
        rx = await Receiver.open()
        try:
            for _ in range(args.repeat):
                for variant in variants:
                    env = variant_env(variant, sink, blocker, baseline)
                    runs["api"][variant].append(await api_run(server, workdir, env, args.duration))
                    runs["drain"][variant].append(
                        await drain_run(server, workdir, rx, env, args.jobs)
                    )
        finally:
            rx.close()
            sink.server.shutdown()
            if args.baseline:
                await asyncio.to_thread(
                    subprocess.run, [*git, "remove", "--force", str(baseline)], check=False
                )
    summary = {
        "api_cpu_ms_per_request": {
            v: median([r["server_cpu_ms_per_request"] for r in runs["api"][v]]) for v in variants
        },
        "api_requests_per_s": {
            v: median([r["throughput_rps"] for r in runs["api"][v]]) for v in variants
        },
        "drain_jobs_per_s": {
            v: median([r["drain_jobs_per_s"] for r in runs["drain"][v]]) for v in variants
        },
        "worker_cpu_us_per_job": {
            v: median([r["worker_cpu_us_per_job"] for r in runs["drain"][v]]) for v in variants
        },
        "exported_bytes": sink.received,
    }
    summary["variants"] = list(variants)
    return {"repeat": args.repeat, "jobs": args.jobs, "runs": runs, "summary": summary}


def lines(summary: dict[str, Any]) -> list[str]:
    cpu, rps = summary["api_cpu_ms_per_request"], summary["api_requests_per_s"]
    drain, wcpu = summary["drain_jobs_per_s"], summary["worker_cpu_us_per_job"]
    out = ["Tracing"]
    for variant in summary["variants"]:
        out.append(
            f"  {variant:>6}: API {cpu[variant]:.3f} ms CPU per POST /jobs ({rps[variant]:,.0f}"
            f" req/s); drain {drain[variant]:,.0f} jobs/s, worker CPU {wcpu[variant]:.0f} µs/job"
        )
    out.append(f"  exported to the sink: {summary['exported_bytes']:,} bytes")
    return out


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Tracing off against the services without it (`--baseline`): what the code tracing
    added costs when off. "absent" has no target: that it ran at all shows off imports
    nothing, and its figures differ from off's by noise alone."""
    cpu, drain = summary["api_cpu_ms_per_request"], summary["drain_jobs_per_s"]
    if "before" not in cpu:
        return []
    return [
        {
            "target": "API CPU per submit, tracing off vs the baseline commit (ratio)",
            "goal": "<= 1.05",
            "measured": cpu["off"] / cpu["before"],
            "met": cpu["off"] / cpu["before"] <= 1.05,
        },
        {
            "target": "drain, tracing off vs the baseline commit (ratio)",
            "goal": ">= 0.90",
            "measured": drain["off"] / drain["before"],
            "met": drain["off"] / drain["before"] >= 0.90,
        },
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 repeat, 3 s, 2,000 jobs")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of API load")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--baseline", help="a commit whose services run as 'before'")
    args = parser.parse_args()
    if args.quick:
        args.repeat, args.duration, args.jobs = 1, 3.0, 2_000
    result = asyncio.run(run(args))
    out = ROOT / "bench-results" / "tracing.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    sys.exit(step.report(result["summary"], lines, targets))


if __name__ == "__main__":
    main()
