"""Submit throughput of one `jobqueue-api` process: single `POST /jobs` and `POST /jobs/batch`.

No workers run meanwhile, so the API and PostgreSQL have the machine to
themselves apart from this client.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from bench.adapters.ours import Ours
from bench.adapters.ours_jobs import JOB_TYPE
from bench.stats import latency_ms

BATCH_SIZE = 1000


async def single(adapter: Ours, requests: int, concurrency: int) -> dict[str, Any]:
    """`requests` POST /jobs from `concurrency` keep-alive clients: per-request latency, jobs/s."""
    await adapter.submit({})  # the API is up and its connections are warm
    left = iter(range(requests))
    durations: list[float] = []

    async def client() -> None:
        for _ in left:
            started = time.perf_counter()
            await adapter.submit({})
            durations.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {"jobs_per_s": requests / elapsed, **latency_ms(durations), "concurrency": concurrency}


async def batch(adapter: Ours, jobs: int, concurrency: int) -> dict[str, Any]:
    """`jobs` submitted as POST /jobs/batch of 1,000 from `concurrency` clients: jobs/s."""
    body = json.dumps({"jobs": [{"type": JOB_TYPE, "payload": {}}] * BATCH_SIZE}).encode()
    await adapter.submit_many(body)  # warm, and fails fast where the route is missing
    left = iter(range(max(jobs // BATCH_SIZE, 1)))
    created = 0

    async def client() -> None:
        nonlocal created
        for _ in left:
            # Not `created += await ...`: that reads `created` before the await, and the
            # clients' counts would overwrite one another.
            answered = await adapter.submit_many(body)
            created += answered

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    sent = max(jobs // BATCH_SIZE, 1) * BATCH_SIZE
    if created != sent:
        raise RuntimeError(f"POST /jobs/batch created {created} of {sent} jobs without keys")
    return {
        "jobs_per_s": created / elapsed,
        "batch_size": BATCH_SIZE,
        "concurrency": concurrency,
        "requests": created // BATCH_SIZE,
    }
