"""Backlog behaviour of our queue: claim latency and drain rate with a big table vs an empty one.

The backlog table holds `completed` finished rows and `pending` due rows,
written by one `INSERT ... SELECT generate_series` and then vacuumed (as
autovacuum would be, on a table this size, before anyone measured). The empty
table holds only the jobs the measurement consumes. Both are measured the same
way, with no workers running for the claim latency:

- claim latency: `claim_samples` single `claim(n)` statements, run as the worker runs
  them (`jobcore.compiled`), each committing on its own, timed around the statement;
  the claimed jobs are then completed.
- drain rate: workers start on the table and drain it; the rate is taken from
  the completion timestamps of jobs `skip`..`skip + window` (so start-up is
  excluded identically), and the workers are stopped once past that window.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench import pg
from bench.adapters.base import log_tail, to_the_end
from bench.adapters.ours import Ours
from bench.adapters.ours_jobs import JOB_TYPE
from bench.stats import latency_ms
from jobcore import compiled
from jobcore.rows import Lease
from jobcore.states import Operation

LEASE_SECONDS = 60.0

FILL = f"""
INSERT INTO jobqueue.jobs (id, type, payload, status, attempts, max_attempts, run_at, lease_token,
                  created_at, updated_at)
SELECT gen_random_uuid(), '{JOB_TYPE}', '{{}}'::jsonb,
       CASE WHEN g <= $1::bigint THEN 'completed' ELSE 'pending' END,
       CASE WHEN g <= $1::bigint THEN 1 ELSE 0 END,
       5,
       t, CASE WHEN g <= $1::bigint THEN 1 ELSE 0 END, t, t
FROM generate_series(1, $1::bigint + $2::bigint) AS g,
     LATERAL (SELECT now() - interval '2 days' + g * interval '10 ms' AS t) AS times
"""


async def fill(adapter: Ours, completed: int, pending: int) -> None:
    """Add `completed` finished and `pending` due jobs in one statement, then VACUUM ANALYZE."""
    assert adapter.sql.conn is not None
    await adapter.sql.conn.execute(FILL, completed, pending, timeout=1800)
    await adapter.sql.conn.execute("VACUUM ANALYZE jobqueue.jobs", timeout=1800)


async def pending_count(adapter: Ours) -> int:
    return int(
        await adapter.sql.value("SELECT count(*) FROM jobqueue.jobs WHERE status = 'pending'")
    )


async def claim_latency(adapter: Ours, samples: int, n: int) -> dict[str, Any]:
    durations: list[float] = []
    leases: list[Lease] = []
    for _ in range(samples):
        async with adapter.engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            started = time.perf_counter()
            claimed = await compiled.claim(raw, {"default": n}, LEASE_SECONDS)
            durations.append(time.perf_counter() - started)
        leases.extend(job.lease for job in claimed)
    async with adapter.engine.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        await compiled.record(raw, Operation.COMPLETE, leases)
    return latency_ms(durations)


async def drain_window(
    adapter: Ours, processes: int, skip: int, window: int, limit: float
) -> dict[str, float]:
    assert adapter.sql.conn is not None
    since = float(await adapter.sql.value("SELECT extract(epoch FROM clock_timestamp())"))
    await adapter.start_workers(processes)
    try:
        deadline = time.monotonic() + limit
        while await adapter.completed_total() < skip + window + 1:
            if time.monotonic() > deadline:
                done = await adapter.completed_total()
                raise TimeoutError(
                    f"backlog drain: {done:.0f} of {skip + window + 1} jobs completed after"
                    f" {limit:.0f}s; {await pending_count(adapter)} pending\n"
                    + log_tail(adapter.workdir / "jobqueue-worker.log")
                )
            await asyncio.sleep(0.2)
    finally:
        await to_the_end(adapter.stop_workers())
    rows = await adapter.sql.conn.fetch(
        f"SELECT extract(epoch FROM updated_at) AS at FROM {pg.RETAINED}"
        " WHERE status = 'completed' AND updated_at >= to_timestamp($1)"
        " ORDER BY updated_at LIMIT $2",
        since,
        skip + window + 1,
    )
    times = [float(row["at"]) for row in rows]
    elapsed = max(times[skip + window] - times[skip], 1e-6)
    return {"drain_jobs_per_s": window / elapsed}


async def measure(
    adapter: Ours,
    *,
    processes: int,
    claim_samples: int,
    claim_n: int,
    skip: int,
    window: int,
    limit: float,
) -> dict[str, Any]:
    claims = await claim_latency(adapter, claim_samples, claim_n)
    drain = await drain_window(adapter, processes, skip, window, limit)
    return {"claim": claims, **drain}


def consumed(claim_samples: int, claim_n: int, skip: int, window: int, slots: int) -> int:
    """Pending jobs one measurement uses up, with room for the jobs in flight at the stop."""
    return claim_samples * claim_n + skip + window + 1 + 2 * slots + window // 10


def difference_pct(empty: float, full: float) -> float:
    return (full - empty) / empty * 100 if empty else 0.0
