"""What WORKER_SYNCHRONOUS_COMMIT=off buys a drain: commits that do not wait for their WAL flush.

    python -m bench.commit [--repeat R] [--jobs N]

Each run is a drain as in `bench.measure.drain` (N no-op jobs inserted in one
transaction, rate from its commit to the last completion) on a fresh database and its
own `jobqueue-worker` with 2 processes of WORKERS=50, warmed up first; the two variants
differ in WORKER_SYNCHRONOUS_COMMIT only (`on`, the default, against `off`), and which
runs first alternates with the repeat. Each run reports the worker processes' CPU per
job (from /proc, which hardly moves with the machine's load, unlike the rate) and the
WAL flushes PostgreSQL made per job (`pg_stat_wal.wal_sync`, the whole server's: other
work on it counts too). Medians of the repeats; JSON in bench-results/commit.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import asyncpg

from bench import costs, pg
from bench.adapters.base import to_the_end
from bench.adapters.ours import MAX_ATTEMPTS, Ours
from bench.adapters.ours_jobs import JOB_TYPE
from bench.beacon import Receiver
from bench.procs import ROOT
from bench.stats import median
from jobcore.ids import new_id
from jobcore.rows import NewJob

VARIANTS = ("on", "off")
PROCESSES = 2
WORKERS = 50


async def _wal_syncs(server: str) -> float:
    conn = await asyncpg.connect(server)
    try:
        return float(await conn.fetchval("SELECT wal_sync FROM pg_stat_wal"))
    finally:
        await conn.close()


async def drain_run(
    server: str, workdir: Path, rx: Receiver, variant: str, n: int
) -> dict[str, float]:
    ours = Ours(server, workdir, WORKERS)
    try:
        jobs = [NewJob(new_id(), JOB_TYPE, {}, MAX_ATTEMPTS) for _ in range(n)]
        figures = await costs.drain_with_cpu(
            ours,
            rx,
            PROCESSES,
            jobs,
            300,
            {"WORKER_SYNCHRONOUS_COMMIT": variant},
            counter=lambda: _wal_syncs(server),
        )
        figures["wal_syncs_per_job"] = figures.pop("counted_per_job")
        return figures
    finally:
        await to_the_end(ours.cleanup())


async def run(repeat: int, n: int) -> dict[str, Any]:
    server = pg.server_url()
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="jq-bench-commit-") as tmp:
        rx = await Receiver.open()
        try:
            for rep in range(repeat):
                order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
                for variant in order:
                    figures = await drain_run(server, Path(tmp), rx, variant, n)
                    runs[variant].append(figures)
                    print(
                        f"  {rep + 1}/{repeat} WORKER_SYNCHRONOUS_COMMIT={variant}:"
                        f" {figures['drain_jobs_per_s']:,.0f} jobs/s,"
                        f" {figures['worker_cpu_us_per_job']:.0f} us worker CPU a job,"
                        f" {figures['wal_syncs_per_job']:.3f} WAL flushes a job",
                        flush=True,
                    )
        finally:
            rx.close()
    summary = {
        variant: {
            key: median([r[key] for r in results])
            for key in ("drain_jobs_per_s", "worker_cpu_us_per_job", "wal_syncs_per_job")
        }
        for variant, results in runs.items()
    }
    return {
        "repeat": repeat,
        "jobs": n,
        "processes": PROCESSES,
        "workers": WORKERS,
        "load_average": os.getloadavg(),
        "summary": summary,
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000)
    args = parser.parse_args()
    result = asyncio.run(run(args.repeat, args.jobs))
    s = result["summary"]
    print(f"Drain of {args.jobs:,} no-op jobs, {PROCESSES} processes x {WORKERS} (medians)")
    for variant, f in s.items():
        print(
            f"  WORKER_SYNCHRONOUS_COMMIT={variant:<3} {f['drain_jobs_per_s']:>8,.0f} jobs/s"
            f"  {f['worker_cpu_us_per_job']:>4.0f} us worker CPU a job"
            f"  {f['wal_syncs_per_job']:.3f} WAL flushes a job"
        )
    on, off = s["on"], s["off"]
    print(
        f"  off / on: drain x{off['drain_jobs_per_s'] / on['drain_jobs_per_s']:.2f},"
        f" worker CPU a job x{off['worker_cpu_us_per_job'] / on['worker_cpu_us_per_job']:.2f}"
    )
    out = ROOT / "bench-results" / "commit.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
