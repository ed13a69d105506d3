"""Waiting for a job (`GET /jobs/{id}?wait=`): how soon the answer follows the finish, a
thousand waiters on one API process, and what the finishing notification costs the worker.

    python -m bench.waiting [--quick] [--samples S] [--clients C] [--waiters W] [--jobs N]
                            (also a step of `make bench`)

One fresh database, a real `jobqueue-worker` (`processes` x `workers`, warmed up) and,
for the first two measurements, one real `jobqueue-api` (MAX_CONNECTIONS raised to let
the waiters in; every other setting at its default):

- latency: `clients` keep-alive clients, each in a loop: `POST /jobs` a job that sleeps
  50 ms, then `GET /jobs/{id}?wait=30s`, noting `time.time()` when the whole answer has
  arrived. Afterwards each job's `finished_at` is read from the table: it is the
  database's `now()` in the write that finished the job, taken when that write began, so
  "answer arrived minus finished_at" (both on this machine's one clock) overstates the
  time from the finishing commit by that write's own duration. A job that finished
  before its waiter marked it (`awaited` still false) was answered without a
  notification; how many did is reported.
- a thousand waiters: `waiters` no-op jobs inserted due in an hour, one `GET
  /jobs/{id}?wait=60s` each on a connection of its own (opened 100 at a time: the
  listen backlog), until every job is marked awaited; then the jobs are made due (run_at
  = now(), with the workers' wake-up) and the worker runs them. Reported: how many were
  answered 200 with the finished job, the time from the last `finished_at` to the last
  answer, and the API's database connections (`pg_stat_activity`, sampled every 20 ms
  from the first waiter to the last answer) against its pool's size.
- drain with every job waited on (run first, before the API starts): the harness holds
  the one LISTEN on the finished channel (as an API process does); `jobs` no-op jobs inserted in one
  transaction with `awaited` set to true (what each waiter's mark does) or to false
  (nobody waiting), so every finishing write sends a notification or none; the rate is
  that of `bench.measure.drain`. `pairs` pairs, the first of each alternating;
  notifications received are counted, and the worker processes' CPU per job is read from
  /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg

from bench import measure, pg, profile, step
from bench.adapters.base import to_the_end
from bench.adapters.ours import MAX_ATTEMPTS, Ours
from bench.adapters.ours_jobs import JOB_TYPE, SLEEP_SECONDS, SLEEP_TYPE
from bench.beacon import Receiver
from bench.http import Connection
from bench.stats import latency_ms, median
from bench.webhooks import cpu_seconds
from jobcore import queries, store
from jobcore.db import session_name
from jobcore.ids import new_id
from jobcore.rows import NewJob
from jobqueue_api.database import POOL_SIZE

WAIT = "30s"  # the wait each latency client asks for
THOUSAND_WAIT = "60s"
LATENCY_TARGET_MS = 100.0  # p99 from the finishing commit to the answer
OPENING = 100  # connections opened at once: more would overflow the API's listen backlog
SAMPLE_EVERY = 0.02  # seconds between two reads of the API's database connections
VARIANTS = ("waited", "unwaited")

# The API's sessions, by the names this release gives them.
_API, _LISTEN = session_name("jobqueue-api"), session_name("jobqueue-api-listen")
_BACKENDS = (
    "SELECT application_name, count(*) FROM pg_stat_activity"
    " WHERE datname = current_database()"
    f" AND application_name IN ('{_API}', '{_LISTEN}')"
    " GROUP BY application_name"
)


def _job_id(answer: bytes) -> UUID:
    return UUID(json.loads(answer)["id"])


async def latency(ours: Ours, clients: int, samples: int) -> dict[str, Any]:
    """`samples` submit-then-wait rounds from `clients` clients; answer arrival minus the
    job's finished_at."""
    left = iter(range(samples))
    arrived: dict[UUID, float] = {}
    statuses: dict[str, int] = {}
    body = json.dumps({"type": SLEEP_TYPE, "payload": {}}).encode()

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", ours.api_port)
        conn = Connection(reader, writer)
        try:
            for _ in left:
                status, answer = await conn.request("POST", "/jobs", body)
                if status != 201:
                    raise RuntimeError(f"POST /jobs answered {status}: {answer[:200]!r}")
                job_id = _job_id(answer)
                status, answer = await conn.request("GET", f"/jobs/{job_id}?wait={WAIT}")
                arrived[job_id] = time.time()
                if status != 200:
                    raise RuntimeError(f"GET ?wait answered {status}: {answer[:200]!r}")
                got = json.loads(answer)["status"]
                statuses[got] = statuses.get(got, 0) + 1
        finally:
            conn.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    assert ours.sql.conn is not None
    rows = await ours.sql.conn.fetch(
        "SELECT id, extract(epoch FROM finished_at)::float8 AS at, awaited"
        f" FROM {pg.RETAINED}"
        " WHERE id = ANY($1::uuid[])",
        list(arrived),
    )
    finished = [r for r in rows if r["at"] is not None]
    delays = [arrived[r["id"]] - r["at"] for r in finished]
    return {
        **latency_ms(delays),
        "max_ms": max(delays) * 1000,
        "clients": clients,
        "job_ms": SLEEP_SECONDS * 1000,
        "answered_completed": statuses.get("completed", 0),
        "answered_unfinished": samples - len(finished),
        "notified": sum(1 for r in finished if r["awaited"]),
    }


async def _api_backends(conn: asyncpg.Connection) -> dict[str, int]:
    return {name: int(n) for name, n in await conn.fetch(_BACKENDS)}


def _enough_file_descriptors(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < n:
        if hard != resource.RLIM_INFINITY and hard < n:
            raise RuntimeError(f"{n} waiters need {n} file descriptors; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


async def thousand(ours: Ours, waiters: int, limit: float = 120) -> dict[str, Any]:
    """`waiters` concurrent waits on one API process, answered when the worker finishes
    their jobs; the API's database connections meanwhile."""
    _enough_file_descriptors(waiters + 256)
    jobs = [NewJob(new_id(), JOB_TYPE, {}, MAX_ATTEMPTS, delay=3600) for _ in range(waiters)]
    await ours.insert(jobs)
    sampler_conn = await asyncpg.connect(ours.url)
    most: dict[str, int] = {}
    answering = True

    async def sample() -> None:
        while answering:
            for name, n in (await _api_backends(sampler_conn)).items():
                most[name] = max(most.get(name, 0), n)
            await asyncio.sleep(SAMPLE_EVERY)

    opening = asyncio.Semaphore(OPENING)
    arrived: dict[UUID, float] = {}
    answers: dict[UUID, tuple[int, str]] = {}

    async def wait_for(job_id: UUID) -> None:
        async with opening:
            reader, writer = await asyncio.open_connection("127.0.0.1", ours.api_port)
        conn = Connection(reader, writer)
        try:
            status, answer = await conn.request("GET", f"/jobs/{job_id}?wait={THOUSAND_WAIT}")
            arrived[job_id] = time.time()
            answers[job_id] = (status, json.loads(answer).get("status", "") if answer else "")
        finally:
            conn.close()

    sampler = asyncio.create_task(sample())
    try:
        began = time.monotonic()
        waiting = [asyncio.create_task(wait_for(job.id)) for job in jobs]
        deadline = began + limit
        while (
            marked := int(
                await ours.sql.value(
                    "SELECT count(*) FROM jobqueue.jobs WHERE awaited AND status = 'pending'"
                )
            )
        ) < waiters:
            failed = [t for t in waiting if t.done() and t.exception() is not None]
            if failed:
                raise RuntimeError(f"a waiter failed: {failed[0].exception()!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{marked} of {waiters} jobs marked awaited after {limit:.0f}s")
            await asyncio.sleep(0.05)
        registered = time.monotonic() - began
        during_wait = dict(most)
        assert ours.sql.conn is not None
        async with ours.engine.begin() as conn:
            await conn.exec_driver_sql(
                "UPDATE jobqueue.jobs SET run_at = now() WHERE status = 'pending' AND awaited"
            )
            await store.notify(conn)
        released = time.time()
        await asyncio.wait_for(asyncio.gather(*waiting), limit)
    finally:
        answering = False
        await sampler
        await sampler_conn.close()
    rows = await ours.sql.conn.fetch(
        f"SELECT id, extract(epoch FROM finished_at)::float8 AS at FROM {pg.RETAINED}"
        " WHERE id = ANY($1::uuid[])",
        [job.id for job in jobs],
    )
    finished_at = {r["id"]: r["at"] for r in rows}
    answered = sum(
        1
        for job_id, (status, job_status) in answers.items()
        if status == 200 and job_status == "completed" and finished_at.get(job_id) is not None
    )
    delays = [arrived[i] - at for i, at in finished_at.items() if at is not None and i in arrived]
    last_finish = max((at for at in finished_at.values() if at is not None), default=released)
    return {
        "waiters": waiters,
        "answered": answered,
        "registered_s": registered,
        "release_to_last_answer_s": max(arrived.values()) - released,
        "last_finish_to_last_answer_ms": (max(arrived.values()) - last_finish) * 1000,
        "from_finish": latency_ms(delays) if delays else {},
        "pool_size": POOL_SIZE,
        # At most, over every sample from the first waiter to the last answer.
        "api_connections": most.get(_API, 0),
        "listen_connections": most.get(_LISTEN, 0),
        "api_connections_while_waiting": during_wait.get(_API, 0),
    }


class _Heard:
    """Notifications on the finished channel, counted; `reached` is set at `goal`."""

    def __init__(self) -> None:
        self.count = 0
        self.goal = 0
        self.reached = asyncio.Event()

    def __call__(self, *_: Any) -> None:
        self.count += 1
        if self.count >= self.goal:
            self.reached.set()

    def expect(self, more: int) -> None:
        self.goal = self.count + more
        self.reached.clear()


async def _drain(ours: Ours, n: int, awaited: bool, limit: float, heard: _Heard) -> dict[str, Any]:
    jobs = [NewJob(new_id(), JOB_TYPE, {}, MAX_ATTEMPTS) for _ in range(n)]

    async def enqueue(_: int) -> None:
        async with ours.engine.begin() as conn:
            for i in range(0, n, 10_000):
                await store.submit_many(conn, jobs[i : i + 10_000])
            # What every waiter's mark does (jobcore.control.watch), in one statement; the
            # same update without waiters, so both tables hold the same row versions.
            await conn.exec_driver_sql(
                f"UPDATE jobqueue.jobs SET awaited = {'true' if awaited else 'false'}"
                " WHERE status = 'pending'"
            )
            await store.notify(conn)

    before = heard.count
    heard.expect(n)
    pids = profile.worker_children(ours.worker_procs[0].pid)
    cpu = cpu_seconds(pids)
    logged = ours.worker_log_size()
    figures = await measure.drain(ours, n, limit, enqueue)
    used = cpu_seconds(pids) - cpu
    if awaited:
        # Notifications are delivered after their commit: give the last ones a moment.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(heard.reached.wait(), 5)
    return {
        "variant": VARIANTS[0] if awaited else VARIANTS[1],
        **figures,
        "notifications": heard.count - before,
        "worker_cpu_us_per_job": used / n * 1e6,
        "database_outages": ours.outages_since(logged),
    }


async def drains(ours: Ours, n: int, pairs: int, limit: float) -> list[dict[str, Any]]:
    """`pairs` pairs of drains, every job awaited or none, the first alternating."""
    heard = _Heard()
    listener = await asyncpg.connect(ours.url)
    try:
        await listener.add_listener(queries.FINISHED_CHANNEL, heard)
        out = []
        for pair in range(pairs):
            order = (True, False) if pair % 2 == 0 else (False, True)
            for awaited in order:
                out.append({"pair": pair, **await _drain(ours, n, awaited, limit, heard)})
    finally:
        await listener.close()
    return out


async def session(
    server: str,
    workdir: Path,
    rx: Receiver,
    *,
    workers: int,
    processes: int,
    clients: int,
    samples: int,
    waiters: int,
    jobs: int,
    pairs: int,
    limit: float,
) -> dict[str, Any]:
    """The three measurements on one fresh database; see the module docstring."""
    ours = Ours(server, workdir, workers)
    try:
        await ours.prepare()
        await ours.start_workers(processes)
        await measure.warm_up(
            ours,
            rx,
            processes,
            submit=lambda payload: ours.insert([NewJob(new_id(), JOB_TYPE, payload, MAX_ATTEMPTS)]),
        )
        runs = await drains(ours, jobs, pairs, limit) if jobs and pairs else []
        await ours.start_api(MAX_CONNECTIONS=str(max(512, waiters + clients + 64)))
        logged = ours.worker_log_size()
        waited = await latency(ours, clients, samples)
        waited["database_outages"] = ours.outages_since(logged)
        logged = ours.worker_log_size()
        many = await thousand(ours, waiters) if waiters else {}
        if many:
            many["database_outages"] = ours.outages_since(logged)
    finally:
        await to_the_end(ours.cleanup())
    return {
        "kind": "waiting",
        "processes": processes,
        "workers": workers,
        "latency": waited,
        "waiters": many,
        "drains": runs,
    }


# --- summary -------------------------------------------------------------------------


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The waiting run, with the drains' medians and their ratio (waited / unwaited)."""
    runs = [r for r in results if r["kind"] == "waiting"]
    if not runs:
        return {}
    run = runs[-1]
    out: dict[str, Any] = {
        "processes": run["processes"],
        "workers": run["workers"],
        "latency": run["latency"],
    }
    if run["waiters"]:
        out["waiters"] = run["waiters"]
    rows = run["drains"]
    mine = [r for r in rows if r["variant"] == "waited"]
    theirs = [r for r in rows if r["variant"] == "unwaited"]
    if mine and theirs:
        rate = median([r["drain_jobs_per_s"] for r in mine])
        base = median([r["drain_jobs_per_s"] for r in theirs])
        out["drain"] = {
            "jobs": round(mine[0]["drain_jobs_per_s"] * mine[0]["drain_seconds"]),
            "jobs_per_s": rate,
            "without_jobs_per_s": base,
            "ratio": rate / base,
            "worker_cpu_us_per_job": median([r["worker_cpu_us_per_job"] for r in mine]),
            "without_worker_cpu_us_per_job": median([r["worker_cpu_us_per_job"] for r in theirs]),
            "notifications": min(r["notifications"] for r in mine),
            "database_outages": sum(r["database_outages"] for r in rows),
            "without_notifications": max(r["notifications"] for r in theirs),
            "repeats": {
                "waited": [r["drain_jobs_per_s"] for r in mine],
                "unwaited": [r["drain_jobs_per_s"] for r in theirs],
            },
        }
    return out


def targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    if not section:
        return []
    lat = section["latency"]
    out = [
        {
            "target": "GET /jobs/{id}?wait= answered after the finishing commit, p99 (ms)",
            "goal": f"<= {LATENCY_TARGET_MS:g}",
            "measured": lat["p99_ms"],
            "met": lat["p99_ms"] <= LATENCY_TARGET_MS,
        }
    ]
    many = section.get("waiters")
    if many:
        out.append(
            {
                "target": f"{many['waiters']:,} concurrent waiters on one API process all "
                f"answered, its database connections within its pool ({many['pool_size']}) "
                "(answered)",
                "goal": f"= {many['waiters']:,}",
                "measured": many["answered"],
                "met": many["answered"] == many["waiters"]
                and many["api_connections"] <= many["pool_size"]
                and many["listen_connections"] <= 1,
            }
        )
    return out


def lines(section: dict[str, Any]) -> list[str]:
    """The section as text lines for the report."""
    if not section:
        return []
    lat = section["latency"]
    out = [
        "",
        f"Waiting: GET /jobs/{{id}}?wait= on one jobqueue-api process, worker "
        f"{section['processes']} process(es) x WORKERS={section['workers']}",
        f"  answer after the finishing commit, {lat['clients']} clients submitting "
        f"{lat['job_ms']:.0f} ms jobs and waiting: p50 {lat['p50_ms']:.2f} ms, p95 "
        f"{lat['p95_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms, max {lat['max_ms']:.2f} ms "
        f"({lat['samples']:,} waits, {lat['notified']:,} of them answered through the "
        f"notification{step.outages(lat['database_outages'])})",
    ]
    many = section.get("waiters")
    if many:
        out.append(
            f"  {many['waiters']:,} concurrent waiters: {many['answered']:,} answered with the "
            f"finished job, the last {many['last_finish_to_last_answer_ms']:.0f} ms after the "
            f"last finish (p50 {many['from_finish'].get('p50_ms', 0):.0f} ms, p99 "
            f"{many['from_finish'].get('p99_ms', 0):.0f} ms from each job's finish); "
            f"registered in {many['registered_s']:.2f} s; API database connections at most "
            f"{many['api_connections']} (pool {many['pool_size']}) + "
            f"{many['listen_connections']} listening{step.outages(many['database_outages'])}"
        )
    drain = section.get("drain")
    if drain:
        out += [
            f"  drain of {drain['jobs']:,} jobs, every one waited on (a notification each, "
            f"{drain['notifications']:,} heard{step.outages(drain['database_outages'])}) vs none: "
            f"{drain['jobs_per_s']:,.0f} vs "
            f"{drain['without_jobs_per_s']:,.0f} jobs/s: {drain['ratio']:.2f}x (repeats "
            + " / ".join(f"{v:,.0f}" for v in drain["repeats"]["waited"])
            + " vs "
            + " / ".join(f"{v:,.0f}" for v in drain["repeats"]["unwaited"])
            + ")",
            f"    worker CPU per job {drain['worker_cpu_us_per_job']:.0f} µs vs "
            f"{drain['without_worker_cpu_us_per_job']:.0f} µs",
        ]
    return out


# --- command line ----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.waiting", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--samples", type=int, help="waits timed for the latency (default 1000)")
    parser.add_argument("--clients", type=int, default=10, help="latency clients (default 10)")
    parser.add_argument("--waiters", type=int, default=1000, help="concurrent waiters")
    parser.add_argument("--jobs", type=int, help="jobs per drain (default 20000)")
    parser.add_argument("--pairs", type=int, help="pairs of drains (default 3)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument("--server", help="PostgreSQL maintenance URL (default as make bench)")
    args = parser.parse_args(argv)
    samples = args.samples or (200 if args.quick else 1000)
    jobs = args.jobs or (2000 if args.quick else 20_000)
    pairs = args.pairs or (1 if args.quick else 3)

    async def run(workdir: Path) -> dict[str, Any]:
        rx = await Receiver.open()
        try:
            return await session(
                args.server or pg.server_url(),
                workdir,
                rx,
                workers=args.workers,
                processes=args.processes,
                clients=args.clients,
                samples=samples,
                waiters=args.waiters,
                jobs=jobs,
                pairs=pairs,
                limit=120 + jobs / 20,
            )
        finally:
            rx.close()

    with tempfile.TemporaryDirectory(prefix="jobqueue-bench-") as workdir:
        result = asyncio.run(run(Path(workdir)))
    section = summarize([result])
    return step.report(section, lines, targets)


if __name__ == "__main__":
    sys.exit(main())
