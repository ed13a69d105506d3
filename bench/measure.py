"""The measurements, written once against `Adapter` so every system is measured the same way.

Clocks: handler start times come from `time.time()` in the worker (see
`beacon`); completion times from the database's `now()` in the transaction
that recorded the completion. Both read this machine's one wall clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from bench.adapters.base import Adapter
from bench.beacon import Receiver
from bench.stats import latency_ms
from bench.webhooks import cpu_seconds

_markers = itertools.count()


def _marker(kind: str) -> str:
    return f"{kind}{next(_markers)}"


async def wait_drained(adapter: Adapter, limit: float, interval: float = 0.05) -> None:
    deadline = time.monotonic() + limit
    while (left := await adapter.remaining()) > 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{adapter.name}: {left} jobs still unfinished after {limit:.0f}s")
        await asyncio.sleep(interval)


async def warm_up(
    adapter: Adapter,
    rx: Receiver,
    processes: int,
    limit: float = 90,
    submit: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
) -> int:
    """Send single jobs (`submit`, by default the adapter's) until every worker process has
    run one (or time is up).

    Proves the workers are up and connected before anything is timed; returns
    how many distinct processes answered.
    """
    submit = submit or adapter.submit
    pids: set[int] = set()
    deadline = time.monotonic() + limit
    # Once one process answered, the others get a little longer to show up.
    tries_after_first = 0
    while len(pids) < processes and tries_after_first < 200:
        marker = _marker("w")
        future = rx.expect(marker)
        await submit(rx.payload(marker))
        _, pid = await asyncio.wait_for(future, max(1.0, deadline - time.monotonic()))
        pids.add(pid)
        tries_after_first += 1
        await asyncio.sleep(0.005)
    await wait_drained(adapter, 30)
    return len(pids)


async def drain(
    adapter: Adapter,
    n: int,
    limit: float,
    enqueue: Callable[[int], Awaitable[None]] | None = None,
) -> dict[str, float]:
    """Workers idle; enqueue n jobs in bulk (`enqueue`, by default the adapter's); rate from
    the enqueue commit to the last completion."""
    called = time.time()
    await (enqueue or adapter.enqueue_many)(n)
    committed = time.time()
    await wait_drained(adapter, limit)
    finished = await adapter.last_completion()
    elapsed = max(finished - committed, 1e-6)
    return {
        "drain_jobs_per_s": n / elapsed,
        "drain_seconds": elapsed,
        "bulk_enqueue_jobs_per_s": n / max(committed - called, 1e-6),
    }


async def pickup_latency(
    adapter: Adapter, rx: Receiver, samples: int, limit: float = 30
) -> dict[str, Any]:
    """Idle workers; one job at a time; handler start minus submit return (and submit start)."""
    from_commit: list[float] = []
    from_call: list[float] = []
    for _ in range(samples):
        marker = _marker("l")
        future = rx.expect(marker)
        called = time.time()
        await adapter.submit(rx.payload(marker))
        returned = time.time()
        started, _ = await asyncio.wait_for(future, limit)
        from_commit.append(started - returned)
        from_call.append(started - called)
        # Let the worker record the outcome and go idle again; jitter avoids
        # falling into step with any polling period.
        await asyncio.sleep(random.uniform(0.01, 0.03))
    await wait_drained(adapter, limit)
    return {"from_commit": latency_ms(from_commit), "from_call": latency_ms(from_call)}


# Other work on the machine, for the pickup under load: a process that keeps one core busy,
# at the default priority, as the rest of a shared machine would.
_SPIN = "while True: pass"


@contextlib.contextmanager
def busy(processes: int) -> Iterator[list[int]]:
    """`processes` processes each spinning on a core (a load average of about as many) for
    the block; their pids are yielded, and they are killed at its end."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL)
        for _ in range(processes)
    ]
    try:
        yield [p.pid for p in spinners]
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait()


async def round_trips(url: str, samples: int) -> dict[str, float]:
    """`SELECT 1` on a connection of its own, `samples` times, 10–30 ms apart as the pickup's
    submits: what one round trip to PostgreSQL takes on this machine as it is, the least a
    pickup (a notification, then a claim) can take."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        took = []
        for _ in range(samples):
            started = time.perf_counter()
            await conn.fetchval("SELECT 1")
            took.append(time.perf_counter() - started)
            await asyncio.sleep(random.uniform(0.01, 0.03))
    finally:
        await conn.close()
    return latency_ms(took)


def load_average() -> float:
    """The 1-minute load average: what the machine ran while a measurement did."""
    return os.getloadavg()[0]


async def end_to_end(
    adapter: Adapter,
    m: int,
    concurrency: int,
    limit: float,
    processes: Callable[[], dict[str, list[int]]] | None = None,
) -> dict[str, Any]:
    """Workers running; m single submits from `concurrency` clients; until all completed.

    With `processes` (the pids of each part of the system, read at the start and at the
    end), also the CPU each part used per job, in ms (`e2e_cpu_ms_per_job`)."""
    left = iter(range(m))
    parts = processes() if processes else {}
    cpu_before = {part: _cpu_by_pid(pids) for part, pids in parts.items()}

    async def client() -> None:
        for _ in left:
            await adapter.submit({})

    started = time.time()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    submitted = time.time()
    await wait_drained(adapter, limit)
    finished = await adapter.last_completion()
    out: dict[str, Any] = {
        "e2e_jobs_per_s": m / max(finished - started, 1e-6),
        "e2e_submit_jobs_per_s": m / max(submitted - started, 1e-6),
    }
    if processes:
        used = {}
        for part, pids in processes().items():
            before = cpu_before.get(part, {})
            # A process started meanwhile (a pooled connection's backend) counts whole.
            now = _cpu_by_pid(pids)
            used[part] = sum(now[pid] - before.get(pid, 0.0) for pid in now) / m * 1000
        out["e2e_cpu_ms_per_job"] = used
    return out


def _cpu_by_pid(pids: list[int]) -> dict[int, float]:
    """User + system CPU seconds of each process still running."""
    found = {}
    for pid in pids:
        try:
            found[pid] = cpu_seconds([pid])
        except (OSError, IndexError):  # it exited
            continue
    return found
