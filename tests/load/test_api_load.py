"""The API under load: 200 concurrent clients submit jobs to a real `jobqueue-api` for
LOAD_SECONDS (60 by default) while a `jobqueue-worker` with two processes drains them.

No answer is a 5xx (in particular no database-pool exhaustion reaches a client),
no request fails at the connection level, every acknowledged job is in the table,
and the workers complete them all. Latency percentiles, throughput and status
counts are reported (`make load`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import psycopg
import pytest

from tests.load.report import FIGURES, latency_ms
from tests.procs import Service, free_port, wait_for

CLIENTS = int(os.environ.get("LOAD_CLIENTS") or 200)
SECONDS = float(os.environ.get("LOAD_SECONDS") or 60)
DRAIN_DEADLINE = 300.0
BODY = b'{"type": "sleep", "payload": {"duration": "0s"}}'


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    client_errors: Counter[str] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    readiness: Counter[int | str] = field(default_factory=Counter)


async def client(http: httpx.AsyncClient, deadline: float, tally: Tally) -> None:
    """One client on its own keep-alive connection, submitting back to back until the deadline."""
    while time.monotonic() < deadline:
        started = time.perf_counter()
        try:
            r = await http.post("/jobs", content=BODY)
        except httpx.HTTPError as exc:
            tally.client_errors[type(exc).__name__] += 1
            continue
        tally.latencies.append(time.perf_counter() - started)
        tally.statuses[r.status_code] += 1
        if r.status_code >= 500:
            tally.server_errors.append(r.text[:200])


async def probe_readiness(http: httpx.AsyncClient, deadline: float, tally: Tally) -> None:
    """What a load balancer would see: /readyz twice a second, with its usual short timeout."""
    while time.monotonic() < deadline:
        try:
            tally.readiness[(await http.get("/readyz", timeout=5)).status_code] += 1
        except httpx.HTTPError as exc:
            tally.readiness[type(exc).__name__] += 1
        await asyncio.sleep(0.5)


async def drive(base_url: str, clients: int, seconds: float) -> Tally:
    """`clients` clients, each connected (one /healthz) before the clock starts, so the
    figures measure serving rather than client set-up and TCP connection bursts."""
    tally = Tally()
    async with contextlib.AsyncExitStack() as stack:
        https = [
            await stack.enter_async_context(
                httpx.AsyncClient(
                    base_url=base_url,
                    timeout=30,
                    limits=httpx.Limits(max_connections=1),
                    headers={"Content-Type": "application/json"},
                    verify=False,  # plain HTTP on loopback: no CA bundle to load per client
                )
            )
            for _ in range(clients)
        ]
        prober = await stack.enter_async_context(httpx.AsyncClient(base_url=base_url))
        await asyncio.gather(*(http.get("/healthz") for http in https))
        deadline = time.monotonic() + seconds
        await asyncio.gather(
            probe_readiness(prober, deadline, tally),
            *(client(http, deadline, tally) for http in https),
        )
    return tally


def counts(database_url: str) -> dict[str, int]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT status, count(*) FROM jobqueue.jobs GROUP BY status").fetchall()
    return {status: int(n) for status, n in rows}


def ready(url: str, service: Service) -> bool:
    if service.proc.poll() is not None:
        raise AssertionError(f"{service.command} exited:\n{service.output()[-3000:]}")
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.load
def test_api_under_200_concurrent_clients_answers_without_5xx_and_loses_no_job(
    database_url: str,
) -> None:
    api_port, metrics_port = free_port(), free_port()
    api = Service(
        "jobqueue-api", {"DATABASE_URL": database_url, "HTTP_ADDR": f"127.0.0.1:{api_port}"}
    )
    worker = Service(
        "jobqueue-worker",
        {
            "DATABASE_URL": database_url,
            "METRICS_ADDR": f"127.0.0.1:{metrics_port}",
            "WORKER_PROCESSES": "2",
        },
    )
    base_url = f"http://127.0.0.1:{api_port}"
    try:
        wait_for(lambda: ready(base_url + "/readyz", api), 60, "jobqueue-api to be ready")
        wait_for(
            lambda: ready(f"http://127.0.0.1:{metrics_port}/readyz", worker),
            60,
            "jobqueue-worker to be ready",
        )

        started = time.monotonic()
        tally = asyncio.run(drive(base_url, CLIENTS, SECONDS))
        elapsed = time.monotonic() - started
        at_end = counts(database_url)

        created = tally.statuses[201]
        drain_started = time.monotonic()
        wait_for(
            lambda: counts(database_url).get("completed", 0) >= created,
            DRAIN_DEADLINE,
            f"the workers to complete all {created} jobs",
            interval=0.5,
        )
        drain_seconds = time.monotonic() - drain_started
        final = counts(database_url)
    finally:
        api_code = api.stop()
        worker_code = worker.stop()

    requests = sum(tally.statuses.values())
    FIGURES["api_load"] = {
        "clients": CLIENTS,
        "seconds": round(elapsed, 1),
        "requests": requests,
        "requests_per_second": round(requests / elapsed, 1),
        "statuses": {str(code): n for code, n in sorted(tally.statuses.items())},
        "client_errors": dict(tally.client_errors),
        "readyz": {str(status): n for status, n in tally.readiness.items()},
        "latency": latency_ms(tally.latencies),
        "jobs_submitted_per_second": round(created / elapsed, 1),
        "jobs_completed_per_second_under_load": round(at_end.get("completed", 0) / elapsed, 1),
        "jobs_pending_at_end_of_load": at_end.get("pending", 0) + at_end.get("processing", 0),
        "drain_seconds": round(drain_seconds, 1),
        "api_pool_size": 10,
        "worker_processes": 2,
    }

    assert tally.server_errors == [], Counter(tally.server_errors).most_common(5)
    assert not tally.client_errors, tally.client_errors
    assert set(tally.statuses) == {201}, tally.statuses
    # Busy is not unready: a load balancer must not take the API out under load.
    assert set(tally.readiness) == {200}, tally.readiness
    # Every acknowledged job exists and ran once to completion; nothing else was written.
    assert final == {"completed": created}, final
    api_logs = api.logs()
    assert [line for line in api_logs if line["level"] in ("error", "critical")] == []
    served = Counter(line["status"] for line in api_logs if line.get("msg") == "request")
    assert served[201] == created and all(status < 500 for status in served), served
    assert (api_code, worker_code) == (0, 0)
