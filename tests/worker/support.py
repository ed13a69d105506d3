"""Helpers for tests that run the real `jobqueue-worker`: environment, jobs, logs, HTTP."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import store
from jobcore.ids import new_id
from jobcore.rows import Job, NewJob
from jobcore.schema import jobs
from tests.procs import Service, free_port

ROOT = Path(__file__).resolve().parent.parent.parent


class Worker(Service):
    """A running `jobqueue-worker` with its metrics port and execution log."""

    def __init__(self, env: dict[str, str], port: int, exec_log: Path) -> None:
        super().__init__("jobqueue-worker", env)
        self.port = port
        self.exec_log = exec_log

    def get(self, path: str, timeout: float = 5.0) -> httpx.Response:
        return httpx.get(f"http://127.0.0.1:{self.port}{path}", timeout=timeout)

    def status_of(self, path: str) -> int | None:
        """The HTTP status of `path`, or None while nothing answers."""
        try:
            return self.get(path).status_code
        except httpx.HTTPError:
            return None

    def messages(self, msg: str) -> list[dict[str, Any]]:
        return [line for line in self.logs() if line.get("msg") == msg]

    def child_pids(self) -> list[int]:
        """Pids of worker processes that logged their start, in order."""
        return [line["pid"] for line in self.messages("worker process started")]


def start_worker(database_url: str, tmp_path: Path, **overrides: str) -> Worker:
    """Start a worker with test-friendly defaults; `overrides` are environment variables."""
    port = free_port()
    exec_log = tmp_path / "executions.log"
    env = {
        "DATABASE_URL": database_url,
        "METRICS_ADDR": f"127.0.0.1:{port}",
        "WORKER_PROCESSES": "1",
        "WORKERS": "4",
        "POLL_INTERVAL": "0.2s",
        "RECOVERY_INTERVAL": "1s",
        "JOB_HANDLERS": "tests.worker.handlers",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "WORKER_TEST_LOG": str(exec_log),
        "LOG_LEVEL": "info",
        # Unset (empty): the worker makes a fresh metrics directory of its own.
        "PROMETHEUS_MULTIPROC_DIR": "",
        **overrides,
    }
    return Worker(env, port, exec_log)


def read_log(path: Path) -> list[tuple[str, str, int, int]]:
    """The execution log written by tests.worker.handlers: (event, job_id, attempt, pid)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        event, job_id, attempt, pid = line.split()
        rows.append((event, job_id, int(attempt), int(pid)))
    return rows


async def submit(
    engine: AsyncEngine, type: str, payload: Any = None, max_attempts: int = 3, count: int = 1
) -> list[UUID]:
    ids = []
    async with engine.begin() as conn:
        for _ in range(count):
            job, _created = await store.submit(
                conn, NewJob(new_id(), type, {} if payload is None else payload, max_attempts)
            )
            ids.append(job.id)
    return ids


async def fetch(engine: AsyncEngine, ids: list[UUID]) -> dict[UUID, Job]:
    found = {}
    async with engine.connect() as conn:
        for job_id in ids:
            job = await store.get(conn, job_id)
            assert job is not None
            found[job_id] = job
    return found


async def count_by_status(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = await conn.execute(sa.select(jobs.c.status, sa.func.count()).group_by(jobs.c.status))
        return {status: n for status, n in rows}


async def eventually(
    predicate: Callable[[], Awaitable[Any]], within: float, what: str, interval: float = 0.1
) -> Any:
    """Await `predicate` until it returns something truthy; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(interval)


async def until(predicate: Callable[[], Any], within: float, what: str) -> Any:
    """Like `eventually` for a plain (non-async) predicate, without blocking the loop."""

    async def check() -> Any:
        return predicate()

    return await eventually(check, within, what)


async def all_in(engine: AsyncEngine, ids: list[UUID], status: str) -> bool:
    """Every job of `ids` exists and is in `status` (one statement: it is polled)."""
    async with engine.connect() as conn:
        matching = await conn.scalar(
            sa.select(sa.func.count())
            .select_from(jobs)
            .where(jobs.c.id.in_(ids), jobs.c.status == status)
        )
    return matching == len(set(ids))


def read_times(path: Path) -> list[tuple[str, int, float]]:
    """When attempts started, from tests.worker.handlers.stamp: (job_id, attempt, time)."""
    times = Path(str(path) + ".times")
    if not times.exists():
        return []
    rows = []
    for line in times.read_text().splitlines():
        job_id, attempt, at = line.split()
        rows.append((job_id, int(attempt), float(at)))
    return rows


def read_tokens(path: Path) -> list[tuple[str, int, int]]:
    """The claims that ran, from tests.worker.handlers' test.fenced: (job_id, lease_token, pid)."""
    tokens = Path(str(path) + ".tokens")
    if not tokens.exists():
        return []
    rows = []
    for line in tokens.read_text().splitlines():
        job_id, token, pid = line.split()
        rows.append((job_id, int(token), int(pid)))
    return rows


async def submit_jobs(engine: AsyncEngine, jobs: list[NewJob]) -> list[Job]:
    """Submit each NewJob as given (queue, priority, run_at, delay, timeout)."""
    found = []
    async with engine.begin() as conn:
        for new in jobs:
            job, _created = await store.submit(conn, new, notify=True)
            found.append(job)
    return found


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most (start, end) spans open at one instant."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = running = 0
    for _, change in events:  # an end sorts before a start at the same instant
        running += change
        most = max(most, running)
    return most
