"""What concurrency keys cost our worker, and whether a key's jobs wait behind another's.

Drain over keys: the regular drain (`bench.measure.drain`, jobs inserted in one
transaction, rate from its commit to the last completion) of the run's job count, the
jobs spread evenly over `KEYS` keys, the worker started with KEY_CONCURRENCY=*:2 (a limit
that, over that many keys, leaves every slot usable: what it costs is the mechanism, the
keys taking turns and the running jobs counted per key). Its rate is set against our
key-less drain of the same process count in the same run, as is the worker processes'
CPU per job (/proc).

Paused queue: the regular key-less drain, by a worker that also serves queue `PAUSED_QUEUE`,
paused before the worker starts with `PAUSED_BACKLOG` jobs due in it; set against the
key-less drain of the same process count (what a paused queue's backlog costs the other
queues' claims, which never read it).

Fairness: one worker process of `SLOTS` slots (WORKERS), no KEY_CONCURRENCY; `backlog`
jobs of key A (handlers of `SLEEP_SECONDS` each, so key A alone keeps every slot busy for
backlog / SLOTS x SLEEP_SECONDS), inserted in one transaction; `DELAY` later, `B_JOBS`
jobs of key B in one POST /jobs/batch. Each B job's wait runs from that request's start to
its handler's first statement (`bench.beacon`, this machine's one clock). The key-A jobs
still pending once every B job had started are counted: none left would mean B never
had to overtake anything, and the figure would not show fair dispatch.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path
from typing import Any

from bench import costs, measure
from bench.adapters.base import to_the_end
from bench.adapters.ours import MAX_ATTEMPTS, Ours
from bench.adapters.ours_jobs import JOB_TYPE, SLEEP_SECONDS, SLEEP_TYPE
from bench.beacon import Receiver
from bench.stats import latency_ms, median
from jobcore import pauses
from jobcore.ids import new_id
from jobcore.rows import NewJob

KEYS = 1_000  # keys the drain's jobs are spread over
KEY_CONCURRENCY = "*:2"
DRAIN_TARGET = 0.80  # drain over keys over the key-less one, at least
SLOTS = 16  # WORKERS of the fairness run's one process
DELAY = 1.0  # seconds from key A's commit to key B's submission
B_JOBS = 20
WAIT_TARGET_MS = 2_000.0  # every B job started within this of its submission
KEY_A, KEY_B = "A", "B"
PAUSED_QUEUE = "held"
PAUSED_BACKLOG = 20_000
PAUSED_TARGET = 0.90  # the drain beside a paused backlog over the plain one, at least

_markers = itertools.count()


def keyed_jobs(n: int) -> list[NewJob]:
    """`n` no-op jobs, key i % KEYS for the i-th: every key gets its share."""
    width = len(str(KEYS - 1))
    return [
        NewJob(new_id(), JOB_TYPE, {}, MAX_ATTEMPTS, concurrency_key=f"key-{i % KEYS:0{width}}")
        for i in range(n)
    ]


async def drain_session(
    server: str, workdir: Path, rx: Receiver, workers: int, processes: int, n: int, limit: float
) -> dict[str, Any]:
    """One drain of `n` jobs over `KEYS` keys under KEY_CONCURRENCY; a "keys_drain" row."""
    ours = Ours(server, workdir, workers)
    try:
        figures = await costs.drain_with_cpu(
            ours, rx, processes, keyed_jobs(n), limit, {"KEY_CONCURRENCY": KEY_CONCURRENCY}
        )
    finally:
        await to_the_end(ours.cleanup())
    return {
        "kind": "keys_drain",
        "processes": processes,
        "workers": workers,
        "jobs": n,
        "keys": min(KEYS, n),
        "key_concurrency": KEY_CONCURRENCY,
        **figures,
    }


async def paused_session(
    server: str, workdir: Path, rx: Receiver, workers: int, processes: int, n: int, limit: float
) -> dict[str, Any]:
    """The key-less drain of `n` jobs beside a paused queue holding `PAUSED_BACKLOG` due
    jobs; a "keys_paused" row."""
    ours = Ours(server, workdir, workers)
    ours.held = PAUSED_QUEUE

    async def hold() -> None:
        await ours.insert(
            [
                NewJob(new_id(), JOB_TYPE, {}, MAX_ATTEMPTS, queue=PAUSED_QUEUE)
                for _ in range(PAUSED_BACKLOG)
            ]
        )
        async with ours.engine.begin() as conn:
            await pauses.pause(conn, PAUSED_QUEUE)

    jobs = [NewJob(new_id(), JOB_TYPE, {}, MAX_ATTEMPTS) for _ in range(n)]
    try:
        figures = await costs.drain_with_cpu(
            ours, rx, processes, jobs, limit, {"QUEUES": f"default,{PAUSED_QUEUE}"}, None, hold
        )
        still = int(
            await ours.sql.value(
                f"SELECT count(*) FROM jobqueue.jobs WHERE queue = '{PAUSED_QUEUE}'"
                " AND status = 'pending'"
            )
        )
    finally:
        await to_the_end(ours.cleanup())
    if still != PAUSED_BACKLOG:
        raise RuntimeError(f"the paused queue lost {PAUSED_BACKLOG - still} of its jobs")
    return {
        "kind": "keys_paused",
        "processes": processes,
        "workers": workers,
        "jobs": n,
        "paused_backlog": PAUSED_BACKLOG,
        **figures,
    }


def _b_batch(rx: Receiver, markers: list[str]) -> bytes:
    items = [
        {"type": SLEEP_TYPE, "payload": rx.payload(m), "concurrency_key": KEY_B} for m in markers
    ]
    return json.dumps({"jobs": items}).encode()


async def fairness_session(
    server: str, workdir: Path, rx: Receiver, backlog: int
) -> dict[str, Any]:
    """Key A's `backlog` jobs, then key B's `B_JOBS` a second later; B's waits. A
    "keys_fairness" row."""
    ours = Ours(server, workdir, SLOTS)
    try:
        await ours.prepare()
        await ours.start_workers(1)
        await ours.start_api()  # before anything is timed
        await measure.warm_up(
            ours,
            rx,
            1,
            submit=lambda payload: ours.insert([NewJob(new_id(), JOB_TYPE, payload, MAX_ATTEMPTS)]),
        )
        await ours.insert(
            [
                NewJob(new_id(), SLEEP_TYPE, {}, MAX_ATTEMPTS, concurrency_key=KEY_A)
                for _ in range(backlog)
            ]
        )
        committed = time.time()
        markers = [f"k{next(_markers)}" for _ in range(B_JOBS)]
        futures = [rx.expect(m) for m in markers]
        body = _b_batch(rx, markers)
        await asyncio.sleep(max(0.0, committed + DELAY - time.time()))
        called = time.time()
        created = await ours.submit_many(body)
        if created != B_JOBS:
            raise RuntimeError(f"POST /jobs/batch created {created} of {B_JOBS} jobs of key B")
        # Bounded by key A's whole drain: without fair dispatch B would start after it.
        limit = 60 + backlog / SLOTS * SLEEP_SECONDS * 2
        started = await asyncio.wait_for(asyncio.gather(*futures), timeout=limit)
        a_left = int(
            await ours.sql.value(
                "SELECT count(*) FROM jobqueue.jobs WHERE status = 'pending'"
                f" AND concurrency_key = '{KEY_A}'"
            )
        )
    finally:
        await to_the_end(ours.cleanup())
    waits = [start - called for start, _ in started]
    return {
        "kind": "keys_fairness",
        "slots": SLOTS,
        "processes": 1,
        "a_jobs": backlog,
        "b_jobs": B_JOBS,
        "delay_s": DELAY,
        "job_seconds": SLEEP_SECONDS,
        **latency_ms(waits),
        "max_ms": max(waits) * 1000,
        "a_pending_after_b": a_left,
    }


# --- summary -------------------------------------------------------------------------


def summarize(results: list[dict[str, Any]], plain: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats (the waits' maximum: the maximum); `plain` holds our key-less
    drain sessions, of which those of the same process count and WORKERS are the base."""
    out: dict[str, Any] = {}
    drains = [r for r in results if r["kind"] == "keys_drain"]
    if drains:
        first = drains[0]
        rate = median([r["drain_jobs_per_s"] for r in drains])
        base_rows = [
            r
            for r in plain
            if r["processes"] == first["processes"] and r["workers"] == first["workers"]
        ]
        base = median([r["drain_jobs_per_s"] for r in base_rows]) if base_rows else None
        base_cpu = [r["worker_cpu_us_per_job"] for r in base_rows if "worker_cpu_us_per_job" in r]
        out["drain"] = {
            "processes": first["processes"],
            "workers": first["workers"],
            "jobs": first["jobs"],
            "keys": first["keys"],
            "key_concurrency": first["key_concurrency"],
            "jobs_per_s": rate,
            "keyless_jobs_per_s": base,
            "ratio": rate / base if base else None,
            "worker_cpu_us_per_job": median([r["worker_cpu_us_per_job"] for r in drains]),
            "keyless_worker_cpu_us_per_job": median(base_cpu) if base_cpu else None,
            "repeats": [r["drain_jobs_per_s"] for r in drains],
        }
    held = [r for r in results if r["kind"] == "keys_paused"]
    if held:
        first = held[0]
        rate = median([r["drain_jobs_per_s"] for r in held])
        base = _base_rate(plain, first)
        out["paused"] = {
            "processes": first["processes"],
            "workers": first["workers"],
            "jobs": first["jobs"],
            "paused_backlog": first["paused_backlog"],
            "jobs_per_s": rate,
            "plain_jobs_per_s": base,
            "ratio": rate / base if base else None,
            "repeats": [r["drain_jobs_per_s"] for r in held],
        }
    fair = [r for r in results if r["kind"] == "keys_fairness"]
    if fair:
        first = fair[0]
        out["fairness"] = {
            **{k: first[k] for k in ("slots", "a_jobs", "b_jobs", "delay_s", "job_seconds")},
            **{k: median([r[k] for r in fair]) for k in ("p50_ms", "p95_ms", "p99_ms")},
            "max_ms": max(r["max_ms"] for r in fair),
            "samples": sum(r["samples"] for r in fair),
            "a_pending_after_b": min(r["a_pending_after_b"] for r in fair),
        }
    return out


def _base_rate(plain: list[dict[str, Any]], first: dict[str, Any]) -> float | None:
    rows = [
        r["drain_jobs_per_s"]
        for r in plain
        if r["processes"] == first["processes"] and r["workers"] == first["workers"]
    ]
    return median(rows) if rows else None


def targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    drain = section.get("drain")
    if drain and drain["ratio"] is not None:
        out.append(
            {
                "target": f"drain over {KEYS:,} keys, KEY_CONCURRENCY={KEY_CONCURRENCY}, "
                "vs no keys (ratio)",
                "goal": f">= {DRAIN_TARGET:.2f}",
                "measured": drain["ratio"],
                "met": drain["ratio"] >= DRAIN_TARGET,
            }
        )
    held = section.get("paused")
    if held and held["ratio"] is not None:
        out.append(
            {
                "target": "drain beside a paused queue's backlog vs without (ratio)",
                "goal": f">= {PAUSED_TARGET:.2f}",
                "measured": held["ratio"],
                "met": held["ratio"] >= PAUSED_TARGET,
            }
        )
    fair = section.get("fairness")
    if fair:
        out.append(
            {
                "target": f"fair dispatch: {B_JOBS} jobs of a key submitted behind "
                f"{fair['a_jobs']:,} of another start within {WAIT_TARGET_MS / 1000:g} s "
                "(longest wait, ms)",
                "goal": f"<= {WAIT_TARGET_MS:.0f}",
                "measured": fair["max_ms"],
                # Only a backlog still there once B had started shows B overtook it.
                "met": fair["max_ms"] <= WAIT_TARGET_MS and fair["a_pending_after_b"] > 0,
            }
        )
    return out


def lines(section: dict[str, Any]) -> list[str]:
    """The section as text lines for the report."""
    drain, fair, held = section.get("drain"), section.get("fairness"), section.get("paused")
    if not drain and not fair and not held:
        return []
    out = ["", "Concurrency keys"]
    if drain:
        base = drain["keyless_jobs_per_s"]
        versus = (
            f" vs no keys {base:,.0f} jobs/s: {drain['ratio']:.2f}x"
            if base
            else " (no key-less drain of that process count to compare)"
        )
        cpu = drain["keyless_worker_cpu_us_per_job"]
        out += [
            f"  drain of {drain['jobs']:,} no-op jobs over {drain['keys']:,} keys, KEY_CONCURRENCY="
            f"{drain['key_concurrency']}, {drain['processes']} process(es), WORKERS="
            f"{drain['workers']}: {drain['jobs_per_s']:,.0f} jobs/s{versus}",
            f"    worker CPU per job {drain['worker_cpu_us_per_job']:.0f} µs"
            + ("" if cpu is None else f" vs {cpu:.0f} µs without keys"),
        ]
    if held:
        base = held["plain_jobs_per_s"]
        out.append(
            f"  drain of {held['jobs']:,} no-op jobs beside queue {PAUSED_QUEUE}, paused with "
            f"{held['paused_backlog']:,} jobs due, {held['processes']} process(es), WORKERS="
            f"{held['workers']}: {held['jobs_per_s']:,.0f} jobs/s"
            + (
                f" vs without {base:,.0f} jobs/s: {held['ratio']:.2f}x"
                if base
                else " (no plain drain of that process count to compare)"
            )
        )
    if fair:
        out.append(
            f"  fairness: {fair['a_jobs']:,} jobs of key A, {fair['b_jobs']} of key B "
            f"{fair['delay_s']:g} s later, {fair['slots']} slots, jobs of "
            f"{fair['job_seconds'] * 1000:.0f} ms: key B waited p50 {fair['p50_ms']:.0f} ms, "
            f"p99 {fair['p99_ms']:.0f} ms, longest {fair['max_ms']:.0f} ms "
            f"({fair['a_pending_after_b']:,} of key A still pending)"
        )
    return out
