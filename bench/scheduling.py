"""Scheduling and routing of our worker: how late scheduled jobs start, and a two-queue drain.

Lateness: a real, idle `jobqueue-worker` with a given POLL_INTERVAL; jobs are
inserted in one transaction (with the NOTIFY a submission sends), their `run_at`
at least `LEAD` seconds ahead and 10–30 ms apart; each handler's first statement
sends its `time.time()` (`bench.beacon`). Lateness is that start minus the
job's `run_at` as stored, both read on this machine's one clock. A negative
lateness is a job started early, which must never happen.

Two queues: the regular drain (`bench.measure.drain`) with the workers serving
QUEUES=a,b and the jobs split evenly over both queues, priorities spread over
-100..100; its rate is compared with the single-queue drain of the same run.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import measure, pg
from bench.adapters.base import to_the_end
from bench.adapters.ours import MAX_ATTEMPTS, Ours
from bench.adapters.ours_jobs import JOB_TYPE
from bench.beacon import Receiver
from bench.stats import latency_ms, median
from jobcore.ids import new_id
from jobcore.rows import NewJob

LEAD = 1.0  # seconds between the insert and the first run_at
GAP = (0.010, 0.030)  # seconds between consecutive run_at
LATENESS_TARGET_MS = 250.0
QUEUES = ("a", "b")
PRIORITIES = (-100, 100)
RATIO_TARGET = 0.9  # two-queue drain rate over the single-queue one, at least

_markers = itertools.count()


def _job(payload: Any, **fields: Any) -> NewJob:
    return NewJob(new_id(), JOB_TYPE, payload, MAX_ATTEMPTS, **fields)


async def lateness(ours: Ours, rx: Receiver, samples: int) -> dict[str, Any]:
    """Insert `samples` jobs due over the next seconds; how long after run_at each started."""
    rng = random.Random(samples)
    due = time.time() + LEAD
    markers, jobs = [], []
    for _ in range(samples):
        marker = f"s{next(_markers)}"
        markers.append(marker)
        jobs.append(_job(rx.payload(marker), run_at=datetime.fromtimestamp(due, UTC)))
        due += rng.uniform(*GAP)
    futures = [rx.expect(m) for m in markers]
    await ours.insert(jobs)
    assert ours.sql.conn is not None
    rows = await ours.sql.conn.fetch(
        f"SELECT id::text, extract(epoch FROM run_at)::float8 FROM {pg.RETAINED}"
        " WHERE id = ANY($1::uuid[])",
        [job.id for job in jobs],
    )
    run_at = {job_id: at for job_id, at in rows}
    started = await asyncio.wait_for(
        asyncio.gather(*futures), timeout=max(0.0, due - time.time()) + 60
    )
    late = [start - run_at[str(job.id)] for job, (start, _) in zip(jobs, started, strict=True)]
    await measure.wait_drained(ours, 30)
    return {
        **latency_ms(late),
        "earliest_ms": min(late) * 1000,
        "latest_ms": max(late) * 1000,
        "early": sum(1 for value in late if value < 0),
    }


async def _insert_mixed(ours: Ours, n: int) -> None:
    rng = random.Random(n)
    await ours.insert(
        [
            _job({}, queue=QUEUES[i % len(QUEUES)], priority=rng.randint(*PRIORITIES))
            for i in range(n)
        ]
    )


async def _started(ours: Ours, rx: Receiver, processes: int, queue: str, **env: str) -> None:
    """Workers started with `env` and warmed up with jobs of `queue` (inserted directly: the
    API is not needed here)."""
    await ours.prepare()
    await ours.start_workers(processes, **env)
    await measure.warm_up(
        ours, rx, processes, submit=lambda payload: ours.insert([_job(payload, queue=queue)])
    )


async def lateness_session(
    server: str, workdir: Path, rx: Receiver, workers: int, processes: int, poll: str, samples: int
) -> dict[str, Any]:
    ours = Ours(server, workdir, workers)
    try:
        await _started(ours, rx, processes, "default", POLL_INTERVAL=poll)
        figures = await lateness(ours, rx, samples)
    finally:
        await to_the_end(ours.cleanup())
    return {"poll_interval": poll, "processes": processes, "workers": workers, **figures}


async def two_queue_session(
    server: str, workdir: Path, rx: Receiver, workers: int, processes: int, n: int, limit: float
) -> dict[str, Any]:
    ours = Ours(server, workdir, workers)
    try:
        await _started(ours, rx, processes, QUEUES[0], QUEUES=",".join(QUEUES))
        figures = await measure.drain(ours, n, limit, lambda k: _insert_mixed(ours, k))
    finally:
        await to_the_end(ours.cleanup())
    return {"processes": processes, "workers": workers, "queues": ",".join(QUEUES), **figures}


# --- summary -------------------------------------------------------------------------


def summarize(results: list[dict[str, Any]], single_queue: dict[str, Any]) -> dict[str, Any]:
    """Medians over repeats (the earliest start: the minimum); `single_queue` holds our
    system's summary, whose drain of the same process count the two-queue drain is set
    against."""
    out: dict[str, Any] = {}
    late = [r for r in results if r["kind"] == "lateness"]
    if late:
        out["lateness"] = {}
        for poll in dict.fromkeys(r["poll_interval"] for r in late):
            rows = [r for r in late if r["poll_interval"] == poll]
            out["lateness"][poll] = {
                **{k: median([r[k] for r in rows]) for k in ("p50_ms", "p95_ms", "p99_ms")},
                "earliest_ms": min(r["earliest_ms"] for r in rows),
                "early": sum(r["early"] for r in rows),
                "samples": sum(r["samples"] for r in rows),
                "processes": rows[0]["processes"],
            }
    two = [r for r in results if r["kind"] == "two_queues"]
    if two:
        processes = two[0]["processes"]
        rate = median([r["drain_jobs_per_s"] for r in two])
        single = single_queue.get(f"drain_{processes}proc_jobs_per_s")
        out["two_queues"] = {
            "queues": two[0]["queues"],
            "processes": processes,
            "workers": two[0]["workers"],
            "jobs_per_s": rate,
            "single_queue_jobs_per_s": single,
            "ratio": rate / single if single else None,
        }
    return out


def targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for poll, figures in section.get("lateness", {}).items():
        out.append(
            {
                "target": f"scheduled-job lateness p99, POLL_INTERVAL={poll} (ms)",
                "goal": f"<= {LATENESS_TARGET_MS:.0f}",
                "measured": figures["p99_ms"],
                "met": figures["p99_ms"] <= LATENESS_TARGET_MS,
            }
        )
        out.append(
            {
                "target": f"scheduled jobs never start early, POLL_INTERVAL={poll} "
                "(earliest lateness, ms)",
                "goal": ">= 0",
                "measured": figures["earliest_ms"],
                "met": figures["early"] == 0,
            }
        )
    two = section.get("two_queues")
    if two and two["ratio"] is not None:
        out.append(
            {
                "target": "drain over two queues, mixed priorities, vs one queue (ratio)",
                "goal": f">= {RATIO_TARGET:.2f}",
                "measured": two["ratio"],
                "met": two["ratio"] >= RATIO_TARGET,
            }
        )
    return out


def lines(section: dict[str, Any]) -> list[str]:
    """The section as text lines for the report."""
    out: list[str] = []
    late = section.get("lateness")
    if late:
        first = next(iter(late.values()))
        out += [
            "",
            f"Scheduled jobs: lateness after run_at (idle worker, {first['processes']} "
            f"process(es); run_at {LEAD:g} s+ ahead, {GAP[0] * 1000:.0f}–{GAP[1] * 1000:.0f} ms "
            "apart)",
        ]
        header = ["POLL_INTERVAL", "p50 ms", "p95 ms", "p99 ms", "earliest ms", "early", "jobs"]
        rows = [
            [
                poll,
                f"{f['p50_ms']:.1f}",
                f"{f['p95_ms']:.1f}",
                f"{f['p99_ms']:.1f}",
                f"{f['earliest_ms']:.2f}",
                str(f["early"]),
                f"{f['samples']:,}",
            ]
            for poll, f in late.items()
        ]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            out.append(
                "  "
                + "  ".join(
                    c.ljust(w) if i == 0 else c.rjust(w)
                    for i, (c, w) in enumerate(zip(row, widths, strict=True))
                )
            )
    two = section.get("two_queues")
    if two:
        single = two["single_queue_jobs_per_s"]
        versus = (
            f" vs one queue {single:,.0f} jobs/s: {two['ratio']:.2f}x"
            if single
            else " (no single-queue drain of that process count to compare)"
        )
        out += [
            "",
            f"Two queues (QUEUES={two['queues']}, WORKERS={two['workers']}), priorities "
            f"{PRIORITIES[0]}..{PRIORITIES[1]}, {two['processes']} process(es):",
            f"  drain {two['jobs_per_s']:,.0f} jobs/s{versus}",
        ]
    return out
