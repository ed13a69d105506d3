"""What enqueueing from Python costs: transactional `enqueue_many` on an asyncpg
connection, and the client's `submit_many` through a real `jobqueue-api`.

    python -m bench.client [--quick] [--jobs N] [--repeat R] [--clients C]
                           (also a step of `make bench`)

One fresh database migrated to head; no worker runs, so what is measured is the writing
of jobs alone (they stay pending); each run starts from an empty table, after a checkpoint.
Jobs are the no-op `bench-noop` with a small payload (`{"n": i}`); each run's items are
built before its clock starts.

- enqueue: on one asyncpg connection of this process, as an application holds one,
  `jobs` jobs in batches of `BATCH`, each batch `jobcore.enqueue_many` in a transaction
  of its own (BEGIN, the one INSERT, the NOTIFY, COMMIT); validation included. Reported:
  jobs/s over the run, each batch's latency, and this process's CPU per job. One batch
  first, untimed (the statement is compiled and prepared once per process/connection).
- submit_many: one real `jobqueue-api` process (default settings); `AsyncClient.submit_many`
  of `jobs` jobs from one client (batches of 1,000 in turn, as the client sends them),
  then from `clients` clients at once, each with its share. One batch first, untimed.

`repeat` runs of each, alternating; medians reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from bench import pg, step
from bench.adapters.base import to_the_end
from bench.adapters.ours import Ours
from bench.adapters.ours_jobs import JOB_TYPE
from bench.stats import latency_ms, median
from bench.webhooks import cpu_seconds
from jobcore import enqueue_many
from jobcore.client import MAX_BATCH, AsyncClient

BATCH = 1_000
CLIENTS = 4  # submit_many clients at once, in the second HTTP run
CONNECTIONS = 4  # asyncpg connections enqueueing at once, in the second enqueue run
ENQUEUE_TARGET = 50_000.0  # jobs/s, transactional enqueue_many in batches of BATCH


def _items(start: int, n: int) -> list[dict[str, Any]]:
    return [{"type": JOB_TYPE, "payload": {"n": i}} for i in range(start, start + n)]


async def enqueue_run(conns: list[asyncpg.Connection], jobs: int, first: int) -> dict[str, Any]:
    """`jobs` jobs through enqueue_many, a transaction per batch of BATCH, the batches shared
    out over `conns` (each connection one transaction at a time)."""
    batches = [_items(first + start, min(BATCH, jobs - start)) for start in range(0, jobs, BATCH)]
    took: list[float] = []

    async def writer(conn: asyncpg.Connection, mine: list[list[dict[str, Any]]]) -> None:
        for batch in mine:
            begun = time.perf_counter()
            async with conn.transaction():
                await enqueue_many(conn, batch)
            took.append(time.perf_counter() - begun)

    n = len(conns)
    backends = [conn.get_server_pid() for conn in conns]
    cpu, db_cpu = time.process_time(), cpu_seconds(backends)
    started = time.perf_counter()
    await asyncio.gather(*(writer(conn, batches[i::n]) for i, conn in enumerate(conns)))
    elapsed = time.perf_counter() - started
    cpu, db_cpu = time.process_time() - cpu, cpu_seconds(backends) - db_cpu
    return {
        "jobs": jobs,
        "connections": n,
        "seconds": elapsed,
        "jobs_per_s": jobs / elapsed,
        "batch_ms": latency_ms(took),
        "cpu_us_per_job": cpu / jobs * 1e6,
        "db_cpu_us_per_job": db_cpu / jobs * 1e6,
    }


async def submit_run(url: str, jobs: int, clients: int, first: int) -> dict[str, Any]:
    """`jobs` jobs through submit_many from `clients` clients at once, each with its share."""
    shares = [jobs // clients + (1 if i < jobs % clients else 0) for i in range(clients)]
    starts = [first + sum(shares[:i]) for i in range(clients)]
    items = [_items(start, share) for start, share in zip(starts, shares, strict=True)]
    opened = [AsyncClient(url, timeout=60) for _ in range(clients)]
    try:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(client.submit_many(part) for client, part in zip(opened, items, strict=True))
        )
        elapsed = time.perf_counter() - started
    finally:
        await asyncio.gather(*(client.aclose() for client in opened))
    created = sum(1 for part in results for r in part if r.status == "created")
    if created != jobs:
        raise RuntimeError(f"submit_many created {created} of {jobs} jobs")
    return {"jobs": jobs, "clients": clients, "seconds": elapsed, "jobs_per_s": jobs / elapsed}


async def session(
    server: str, workdir: Path, *, jobs: int, clients: int, connections: int, repeat: int
) -> dict[str, Any]:
    """The runs on one fresh database; see the module docstring."""
    ours = Ours(server, workdir, 1)
    runs: dict[str, list[dict[str, Any]]] = {
        "enqueue_one": [],
        "enqueue_many": [],
        "submit_one": [],
        "submit_many": [],
    }
    try:
        await ours.prepare()
        await ours.start_api()
        url = f"http://127.0.0.1:{ours.api_port}"
        conns = [await asyncpg.connect(ours.url) for _ in range(connections)]
        try:
            # Untimed: the statement compiled, then prepared on each connection.
            await enqueue_run(conns, BATCH * connections, 0)
            await submit_run(url, MAX_BATCH, 1, 0)
            first = BATCH * connections + MAX_BATCH
            for _ in range(repeat):
                plan: list[tuple[str, Callable[..., Awaitable[dict[str, Any]]], tuple[Any, ...]]]
                plan = [
                    ("enqueue_one", enqueue_run, (conns[:1], jobs, first)),
                    ("enqueue_many", enqueue_run, (conns, jobs, first + jobs)),
                    ("submit_one", submit_run, (url, jobs, 1, first + 2 * jobs)),
                    ("submit_many", submit_run, (url, jobs, clients, first + 3 * jobs)),
                ]
                for kind, run, args in plan:
                    await _empty_queue(conns[0])
                    runs[kind].append(await run(*args))
                    stored = await conns[0].fetchval("SELECT count(*) FROM jobqueue.jobs")
                    if stored != jobs:
                        raise RuntimeError(f"{kind}: {stored} jobs stored, {jobs} written")
                first += 4 * jobs
        finally:
            for conn in conns:
                await conn.close()
    finally:
        await to_the_end(ours.cleanup())
    return {"kind": "client", **runs}


async def _empty_queue(conn: asyncpg.Connection) -> None:
    """Every run writes into an empty table, after a checkpoint: otherwise each run would
    pay for the ones before it (the autovacuum of their rows, the first writes of pages
    after a checkpoint they caused), and the figures would depend on the run order."""
    await conn.execute("TRUNCATE jobqueue.jobs")
    # A role without pg_checkpoint: the runs still start from an empty table.
    with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
        await conn.execute("CHECKPOINT")


# --- summary -------------------------------------------------------------------------


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    runs = [r for r in results if r["kind"] == "client"]
    if not runs or not runs[-1]["enqueue_one"]:
        return {}
    run = runs[-1]

    def rates(rows: list[dict[str, Any]]) -> dict[str, Any]:
        out = {
            "jobs": rows[0]["jobs"],
            "jobs_per_s": median([r["jobs_per_s"] for r in rows]),
            "repeats": [r["jobs_per_s"] for r in rows],
        }
        if "batch_ms" in rows[0]:
            out["connections"] = rows[0]["connections"]
            out["batch_p50_ms"] = median([r["batch_ms"]["p50_ms"] for r in rows])
            out["batch_p99_ms"] = median([r["batch_ms"]["p99_ms"] for r in rows])
            out["cpu_us_per_job"] = median([r["cpu_us_per_job"] for r in rows])
            out["db_cpu_us_per_job"] = median([r["db_cpu_us_per_job"] for r in rows])
        else:
            out["clients"] = rows[0]["clients"]
        return out

    return {"batch": BATCH, **{kind: rates(run[kind]) for kind in KINDS}}


KINDS = ("enqueue_one", "enqueue_many", "submit_one", "submit_many")


def targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    if not section:
        return []
    # On one connection the process and its backend take turns (each waits for the other),
    # so the rate is 1 / (both CPU costs): the machine's rate is the several-connection one.
    figures = section["enqueue_many"]
    return [
        {
            "target": f"transactional enqueue_many on asyncpg, batches of {BATCH:,}, "
            f"{figures['connections']} connections (jobs/s)",
            "goal": f">= {ENQUEUE_TARGET:,.0f}",
            "measured": figures["jobs_per_s"],
            "met": figures["jobs_per_s"] >= ENQUEUE_TARGET,
        }
    ]


def _repeats(values: list[float]) -> str:
    return " / ".join(f"{v:,.0f}" for v in values)


def lines(section: dict[str, Any]) -> list[str]:
    if not section:
        return []
    out = ["", "Client: enqueueing from Python (no worker running; jobs stay pending)"]
    for kind in ("enqueue_one", "enqueue_many"):
        e = section[kind]
        n = e["connections"]
        out.append(
            f"  enqueue_many, a transaction per {section['batch']:,} jobs, on {n} asyncpg "
            f"connection{'s' if n > 1 else ''}: {e['jobs_per_s']:,.0f} jobs/s over "
            f"{e['jobs']:,} (repeats {_repeats(e['repeats'])}); a batch p50 "
            f"{e['batch_p50_ms']:.1f} ms, p99 {e['batch_p99_ms']:.1f} ms; "
            f"CPU a job: {e['cpu_us_per_job']:.1f} µs in this process, "
            f"{e['db_cpu_us_per_job']:.1f} µs in PostgreSQL"
        )
    for kind in ("submit_one", "submit_many"):
        s = section[kind]
        n = s["clients"]
        out.append(
            f"  AsyncClient.submit_many through one jobqueue-api, {n} client"
            f"{'s at once' if n > 1 else ''}: {s['jobs_per_s']:,.0f} jobs/s over "
            f"{s['jobs']:,} (repeats {_repeats(s['repeats'])})"
        )
    return out


# --- command line ----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.client", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--jobs", type=int, help="jobs per run (default 100000)")
    parser.add_argument("--repeat", type=int, help="runs of each, medians reported (default 3)")
    parser.add_argument(
        "--clients", type=int, default=CLIENTS, help="concurrent submit_many clients"
    )
    parser.add_argument(
        "--connections",
        type=int,
        default=CONNECTIONS,
        help="asyncpg connections enqueueing at once",
    )
    parser.add_argument("--server", help="PostgreSQL maintenance URL (default as make bench)")
    args = parser.parse_args(argv)
    jobs = args.jobs or (20_000 if args.quick else 100_000)
    repeat = args.repeat or (1 if args.quick else 3)

    with tempfile.TemporaryDirectory(prefix="jobqueue-bench-") as workdir:
        result = asyncio.run(
            session(
                args.server or pg.server_url(),
                Path(workdir),
                jobs=jobs,
                clients=args.clients,
                connections=args.connections,
                repeat=repeat,
            )
        )
    return step.report(summarize([result]), lines, targets)


if __name__ == "__main__":
    sys.exit(main())
