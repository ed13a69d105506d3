"""What retention costs the queue: a drain while pruning runs, and claims on a table that
many jobs have passed through.

    python -m bench.retention [--quick] [--prefill N] [--churn N] [--jobs N] [--repeat R]
                              (also a step of `make bench`)

Pruning during a drain (`prune_session`, in pairs): a fresh database gets `prefill`
completed jobs that finished a day or two ago (one `INSERT ... SELECT generate_series`,
time-ordered ids built in SQL from each job's creation time as `jobcore.ids` builds
them, then VACUUM ANALYZE). A `jobqueue-worker` starts with RETENTION_COMPLETED=1s
("pruning": its retention round starts at once and deletes them, 5,000 a statement,
pausing between statements) or RETENTION_COMPLETED=0 ("keeping": the same table, nothing
deleted), is warmed up, and, once the first rows are pruned, drains `jobs` fresh no-op jobs
(`bench.measure.drain`). The rows pruned during the drain are read from the worker's
`jobs_pruned_total`, polled every `PRUNE_POLL` seconds in both runs; from it, the share of
the drain that pruning ran through (all of it if prefilled rows are left at its end). The
worker processes' CPU per job comes from /proc.

A table jobs have passed through (`Churned`): `churn` no-op jobs pass through it while a
worker with RETENTION_COMPLETED=24h runs, and moves the completed ones to `jobs_history`.
`cycled` of them are inserted due, in chunks of `CHURN_CHUNK` (SQL, time-ordered ids),
and run by the worker, a chunk ahead at most; the others are inserted finished, spread
over the 22 hours that ended an hour ago, before those chunks, at most `--churn-rate` a
second (`CHURN_RATE`, as a busy deployment finishes them), and only moved: their rows go
through the heap and the indexes of finished jobs, not the claim's, and cost far less
time. Once every completed job has left `jobs`, the worker restarts with
RETENTION_COMPLETED=1h, and retention's time is taken until no job that finished more
than an hour ago is left: the leaves of the past day dropped whole, the rest of the hour
the cut-off falls in deleted row by row. Autovacuum does its work meanwhile; on a server
with autovacuum off, `StandInVacuum` does it by autovacuum's rule. That table and a fresh one
are then measured alike by `bench.backlog.measure` (claim latency of single claims and a
drain window, with the worker's default settings), each after its measured jobs are
inserted and the table vacuumed (VACUUM ANALYZE run by the harness, as autovacuum would
run on a table with this many dead rows before anyone measured) and `WARM_CLAIMS`
untimed claims.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench import backlog, measure, pg, profile, step
from bench.adapters.base import log_tail, to_the_end
from bench.adapters.ours import MAX_ATTEMPTS, Ours
from bench.adapters.ours_jobs import JOB_TYPE
from bench.beacon import Receiver
from bench.http import Connection
from bench.stats import median
from bench.webhooks import cpu_seconds
from jobcore import queries
from jobcore.ids import new_id
from jobcore.rows import NewJob

RETENTIONS = {"pruning": "1s", "keeping": "0"}  # RETENTION_COMPLETED of each run of a pair
# The churned table's worker while the jobs pass through: completed jobs are kept a day, so
# the workers move them to `jobs_history`, a leaf an hour. Then retention at an hour: every
# leaf but the last hour's or two has expired whole. Millions of jobs pass through in
# minutes, far faster than the default RETENTION_RATE deletes; a deployment that busy
# raises it as well.
CHURN_RETENTION = {"RETENTION_COMPLETED": "24h", "RETENTION_RATE": "1000000"}
EXPIRE_RETENTION = {"RETENTION_COMPLETED": "1h", "RETENTION_RATE": "1000000"}
PRUNE_TARGET = 0.90  # drain while pruning over the one without, at least
CHURN_TARGET_PCT = 20.0  # the churned table within this of a fresh one
RETENTION_TARGET_S = 30.0  # the churned jobs' retention, from the worker's start
CHURN_CHUNK = 100_000  # jobs inserted due at once while churning
# Finished jobs inserted per second while churning: what a busy deployment finishes (more
# than one worker of 2 processes runs here). Faster than the move, they would pile up in
# `jobs` as no deployment's would.
CHURN_RATE = 10_000
PACE_STEP = 0.1  # seconds between two paced inserts of finished jobs
PRUNE_POLL = 0.1  # seconds between two reads of jobs_pruned_total during a drain
SHARE_TARGET = 0.9  # pruning ran through at least this share of every drain
WARM_CLAIMS = 20  # untimed claims before the timed ones, on either table

# A time-ordered id (UUID version 7, as `jobcore.ids` makes them) of the time `t`, built from
# random bytes; `t` must be a column of the FROM list.
_V7 = """encode(set_byte(b, 6, (get_byte(b, 6) & 15) | 112), 'hex')::uuid"""
_V7_BYTES = """LATERAL (SELECT overlay(uuid_send(gen_random_uuid())
                        PLACING substring(int8send(floor(extract(epoch FROM t) * 1000)::bigint)
                                          FROM 3)
                        FROM 1 FOR 6) AS b) AS bytes"""

# $1 completed jobs created between two days and one day ago, each finished a second later.
PREFILL = f"""
INSERT INTO jobqueue.jobs (id, type, payload, status, attempts, max_attempts, run_at, lease_token,
                  finished_at, created_at, updated_at)
SELECT {_V7}, '{JOB_TYPE}', '{{}}'::jsonb, 'completed', 1, {MAX_ATTEMPTS}, t, 1,
       t + interval '1 second', t, t + interval '1 second'
FROM generate_series(1, $1::bigint) AS g,
     LATERAL (SELECT now() - interval '2 days' + g * (interval '1 day' / $1::bigint) AS t) AS times,
     {_V7_BYTES}
"""

# $1 completed no-op jobs, as if the worker had run them over the past day: spread evenly
# from $2 to $3 of the 22 hours that ended an hour ago (fractions; later chunks later).
FINISHED = f"""
INSERT INTO jobqueue.jobs (id, type, payload, status, attempts, max_attempts, run_at, lease_token,
                  finished_at, created_at, updated_at)
SELECT {_V7}, '{JOB_TYPE}', '{{}}'::jsonb, 'completed', 1, {MAX_ATTEMPTS}, t, 1, t, t, t
FROM generate_series(1, $1::bigint) AS g,
     LATERAL (SELECT now() - interval '23 hours'
                     + ($2::float8 + ($3::float8 - $2::float8) * g / $1::bigint)
                       * interval '22 hours' AS t) AS times,
     {_V7_BYTES}
"""

# $1 due no-op jobs, created now; the workers are woken at commit.
CHURN = f"""
WITH added AS (
    INSERT INTO jobqueue.jobs (id, type, payload, max_attempts)
    SELECT {_V7}, '{JOB_TYPE}', '{{}}'::jsonb, {MAX_ATTEMPTS}
    FROM generate_series(1, $1::bigint) AS g,
         LATERAL (SELECT now() + g * interval '1 microsecond' AS t) AS times,
         {_V7_BYTES}
    RETURNING 1
)
SELECT count(*), pg_notify('{queries.NOTIFY_CHANNEL}', '') FROM added
"""

_OLD = (
    "SELECT count(*) FROM jobqueue.jobs"
    " WHERE status = 'completed' AND finished_at < now() - interval '1 hour'"
)
_COMPLETED = "SELECT count(*) FROM jobqueue.jobs WHERE status = 'completed'"
_EXPIRED = (
    "SELECT count(*) FROM jobqueue.jobs_history WHERE finished_at < now() - interval '1 hour'"
)
# Whether any is left: one index entry read, so the poll holds its lock on `jobs_history`
# for a moment. A count of millions holds it for seconds, and retention's DROP of a leaf,
# which waits 100 ms for that lock, would find it held nearly every time.
_ANY_EXPIRED = (
    "SELECT EXISTS (SELECT FROM jobqueue.jobs_history"
    " WHERE finished_at < now() - interval '1 hour')"
)
_SIZE = "SELECT pg_table_size('jobqueue.jobs') + pg_indexes_size('jobqueue.jobs')"


async def pruned_total(ours: Ours) -> int:
    """jobs_pruned_total{status="completed"} from the worker's /metrics (0 before any)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", ours.metrics_port)
    conn = Connection(reader, writer)
    try:
        _, body = await conn.request("GET", "/metrics")
    finally:
        conn.close()
    for line in body.decode().splitlines():
        if line.startswith('jobs_pruned_total{status="completed"} '):
            return int(float(line.split()[-1]))
    return 0


async def _until(check: Any, what: str, limit: float, interval: float = 0.05) -> None:
    deadline = time.monotonic() + limit
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {limit:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


async def prune_session(
    server: str,
    workdir: Path,
    rx: Receiver,
    workers: int,
    processes: int,
    prefill: int,
    n: int,
    limit: float,
    variant: str,
) -> dict[str, Any]:
    """One run of a pair: `variant` "pruning" or "keeping" (see `RETENTIONS`)."""
    ours = Ours(server, workdir, workers)
    try:
        await ours.prepare()
        assert ours.sql.conn is not None
        await ours.sql.conn.execute(PREFILL, prefill, timeout=1800)
        await ours.sql.conn.execute("VACUUM ANALYZE jobqueue.jobs", timeout=1800)
        await ours.start_workers(processes, RETENTION_COMPLETED=RETENTIONS[variant])
        await measure.warm_up(
            ours,
            rx,
            processes,
            submit=lambda payload: ours.insert([NewJob(new_id(), JOB_TYPE, payload, MAX_ATTEMPTS)]),
        )
        if variant == "pruning":

            async def begun() -> bool:
                return await pruned_total(ours) > 0

            await _until(begun, "retention's first prune", 60)
        jobs = [NewJob(new_id(), JOB_TYPE, {}, MAX_ATTEMPTS) for _ in range(n)]

        async def enqueue(_: int) -> None:
            await ours.insert(jobs)

        before = await pruned_total(ours)
        pids = profile.worker_children(ours.worker_procs[0].pid)
        cpu = cpu_seconds(pids)
        logged = ours.worker_log_size()
        # When the prune count last grew, read as often in both runs of a pair.
        grew = [time.time()]
        drained = asyncio.Event()

        async def watch() -> None:
            seen = before
            while not drained.is_set():
                polled = time.time()
                now = await pruned_total(ours)
                if now > seen:
                    seen, grew[0] = now, polled
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(drained.wait(), PRUNE_POLL)

        watching = asyncio.create_task(watch())
        try:
            figures = await measure.drain(ours, n, limit, enqueue)
        finally:
            drained.set()
            await watching
        used = cpu_seconds(pids) - cpu
        after = await pruned_total(ours)
        outages = ours.outages_since(logged)
        left = int(await ours.sql.value(_OLD))
        ended = await ours.last_completion()
    finally:
        await to_the_end(ours.cleanup())
    return {
        "kind": "retention_prune",
        "variant": variant,
        "retention_completed": RETENTIONS[variant],
        "processes": processes,
        "workers": workers,
        "prefill": prefill,
        **figures,
        "worker_cpu_us_per_job": used / n * 1e6,
        "pruned_before_drain": before,
        "pruned_during_drain": after - before,
        "prefill_left_after_drain": left,
        # The share of the drain that pruning ran through (1 if it was still pruning the
        # prefill at the end; else until the last poll that saw the count still growing).
        "pruning_share": 1.0
        if left
        else min(1.0, max(0.0, 1 - (ended - grew[0]) / figures["drain_seconds"])),
        "database_outages": outages,
    }


class StandInVacuum:
    """Autovacuum's work on the jobs table when the server has autovacuum off (a test
    server's setting): every autovacuum_naptime, VACUUM it if its dead rows exceed
    autovacuum_vacuum_threshold + autovacuum_vacuum_scale_factor x its live rows, the rule
    autovacuum applies. Unlike autovacuum's, these runs are not throttled (no cost delay).
    With autovacuum on, it does nothing: autovacuum does the work. `first`: seconds to the
    first check (default one naptime), so that a caller can keep the checks out of step with
    its own timeline, as autovacuum's launcher is."""

    def __init__(self, url: str, first: float | None = None) -> None:
        self.url = url
        self.first = first
        self.autovacuum = True
        self.vacuums = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        conn = await asyncpg.connect(self.url)
        settings = {
            name: value
            for name, value in await conn.fetch(
                "SELECT name, setting FROM pg_settings WHERE name IN ('autovacuum',"
                " 'autovacuum_naptime', 'autovacuum_vacuum_threshold',"
                " 'autovacuum_vacuum_scale_factor')"
            )
        }
        self.autovacuum = settings["autovacuum"] == "on"
        if self.autovacuum:
            await conn.close()
            return
        self._task = asyncio.create_task(
            self._run(
                conn,
                float(settings["autovacuum_naptime"]),
                float(settings["autovacuum_vacuum_threshold"]),
                float(settings["autovacuum_vacuum_scale_factor"]),
            )
        )

    async def _run(
        self, conn: asyncpg.Connection, naptime: float, threshold: float, scale: float
    ) -> None:
        wait = naptime if self.first is None else self.first
        try:
            while True:
                await asyncio.sleep(wait)
                wait = naptime
                dead, live = await conn.fetchrow(
                    "SELECT n_dead_tup, n_live_tup FROM pg_stat_user_tables"
                    " WHERE relid = 'jobqueue.jobs'::regclass"
                )
                if dead > threshold + scale * live:
                    await conn.execute("VACUUM jobqueue.jobs", timeout=3600)
                    self.vacuums += 1
        finally:
            await conn.close()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


class Churned:
    """One table `churn` jobs have passed through, kept for every repeat's measurement:
    `cycled` of them run by the worker, the others inserted finished, in bulk."""

    def __init__(
        self,
        server: str,
        workdir: Path,
        workers: int,
        processes: int,
        churn: int,
        cycled: int,
        rate: int = CHURN_RATE,
    ) -> None:
        self.server = server
        self.workdir = workdir
        self.workers = workers
        self.processes = processes
        self.churn = churn
        self.cycled = min(cycled, churn)
        self.rate = rate
        self.ours = Ours(server, workdir, workers)
        self.pushed: dict[str, Any] | None = None

    async def push(self) -> None:
        """Pass `churn` jobs through the table with retention on, then prune what is left."""
        ours = self.ours
        await ours.prepare()
        assert ours.sql.conn is not None
        conn = ours.sql.conn
        logged = ours.worker_log_size()
        vacuum = StandInVacuum(ours.url)
        await vacuum.start()
        try:
            await self._push(ours, conn)
        finally:
            await vacuum.stop()
        stats = await conn.fetchrow(
            "SELECT n_dead_tup, autovacuum_count, autoanalyze_count,"
            " pg_table_size('jobqueue.jobs') AS table_bytes,"
            " pg_indexes_size('jobqueue.jobs') AS index_bytes"
            " FROM pg_stat_user_tables WHERE relid = 'jobqueue.jobs'::regclass"
        )
        assert self.pushed is not None
        self.pushed |= {
            "dead_rows": int(stats["n_dead_tup"]),
            "autovacuum": vacuum.autovacuum,
            "autovacuum_runs": int(stats["autovacuum_count"]),
            "autoanalyze_runs": int(stats["autoanalyze_count"]),
            "harness_vacuums": vacuum.vacuums,
            "table_mb": stats["table_bytes"] / 2**20,
            "indexes_mb": stats["index_bytes"] / 2**20,
            "database_outages": ours.outages_since(logged),
        }

    async def _push(self, ours: Ours, conn: asyncpg.Connection) -> None:
        await ours.start_workers(self.processes, **CHURN_RETENTION)
        started = time.monotonic()
        inserted = 0
        limit = 300 + self.churn / 500
        chunks = max(1, math.ceil(self.cycled / CHURN_CHUNK))
        bulk = self.churn - self.cycled
        done = 0
        step = max(1, int(self.rate * PACE_STEP))
        paced = 0.0  # seconds spent inserting finished jobs, pauses included
        for chunk in range(chunks):
            # The finished rows spread evenly before the chunks the worker runs, `step` at a
            # time, at most `rate` a second (the waits for the worker not counted).
            rows = bulk * (chunk + 1) // chunks - bulk * chunk // chunks
            since, sent = time.monotonic(), 0
            for start in range(0, rows, step):
                n = min(step, rows - start)
                await conn.execute(FINISHED, n, done / bulk, (done + n) / bulk, timeout=600)
                done += n
                sent += n
                await asyncio.sleep(max(0.0, since + sent / self.rate - time.monotonic()))
            paced += time.monotonic() - since
            k = min(CHURN_CHUNK, self.cycled - inserted)
            if k <= 0:
                break
            await conn.execute(CHURN, k, timeout=600)
            inserted += k

            async def room(inserted: int = inserted) -> bool:
                # From the worker's /metrics: a count of the pending rows would cost
                # PostgreSQL more than the poll is worth.
                return inserted - await ours.completed_total() <= CHURN_CHUNK // 2

            await _until(room, "the worker to drain the churn", limit, 0.2)
        await measure.wait_drained(ours, limit, 0.2)
        drained = time.monotonic() - started

        async def all_moved() -> bool:
            return int(await ours.sql.value(_COMPLETED)) == 0

        await _until(all_moved, "every completed job to move to the history", limit, 0.5)
        moved_s = time.monotonic() - started
        await ours.stop_workers()
        # Retention at an hour, from a worker started now (its first round runs at once).
        expired = int(await ours.sql.value(_EXPIRED))
        began = time.monotonic()
        await ours.start_workers(self.processes, **EXPIRE_RETENTION)

        async def all_pruned() -> bool:
            return not await ours.sql.value(_ANY_EXPIRED)

        try:
            await _until(all_pruned, "every expired job to be pruned", limit, 0.2)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{log_tail(self.workdir / 'jobqueue-worker.log')}") from None
        pruned_s = time.monotonic() - began
        pruned = await pruned_total(ours)
        await ours.stop_workers()
        self.pushed = {
            "churn": self.churn,
            "cycled": self.cycled,
            "drained_s": drained,
            "churn_jobs_per_s": self.churn / drained,
            "finished_jobs_per_s": bulk / paced if paced else 0.0,
            "all_moved_s": moved_s,
            "expired": expired,
            "retention_s": pruned_s,
            "pruned": pruned,
        }

    async def measure(self, table: str, rep: int, options: dict[str, Any]) -> dict[str, Any]:
        """Claims and a drain window on the churned table or a fresh one (`table`)."""
        options = dict(options)
        use = options.pop("use") + WARM_CLAIMS * options["claim_n"]
        if table == "churned":
            return await self._measure(self.ours, table, rep, use, options)
        ours = Ours(self.server, self.workdir, self.workers)
        try:
            await ours.prepare()
            return await self._measure(ours, table, rep, use, options)
        finally:
            await to_the_end(ours.cleanup())

    async def _measure(
        self, ours: Ours, table: str, rep: int, use: int, options: dict[str, Any]
    ) -> dict[str, Any]:
        missing = use - await backlog.pending_count(ours)
        if missing > 0:
            await backlog.fill(ours, 0, missing)
        size = await ours.sql.value(_SIZE)
        # A table in use has its hot pages cached; one just vacuumed has not (the churned
        # one outgrows shared_buffers, a fresh one never does): a few claims first, untimed.
        await backlog.claim_latency(ours, WARM_CLAIMS, options["claim_n"])
        figures = await backlog.measure(ours, processes=self.processes, **options)
        return {
            "kind": "retention_churn",
            "table": table,
            "repeat": rep,
            "churn": self.churn,
            "size_mb": size / 2**20,
            **figures,
        }

    async def cleanup(self) -> None:
        await self.ours.cleanup()


# --- summary -------------------------------------------------------------------------


def _pct(base: float, value: float) -> float:
    return (value - base) / base * 100 if base else 0.0


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats: the pair's rates and ratio (pruning / keeping); the churned
    table against a fresh one."""
    out: dict[str, Any] = {}
    runs = [r for r in results if r["kind"] == "retention_prune"]
    mine = [r for r in runs if r["variant"] == "pruning"]
    theirs = [r for r in runs if r["variant"] == "keeping"]
    if mine and theirs:
        rate = median([r["drain_jobs_per_s"] for r in mine])
        base = median([r["drain_jobs_per_s"] for r in theirs])
        out["pruning"] = {
            "processes": mine[0]["processes"],
            "workers": mine[0]["workers"],
            "prefill": mine[0]["prefill"],
            "jobs": round(mine[0]["drain_jobs_per_s"] * mine[0]["drain_seconds"]),
            "jobs_per_s": rate,
            "without_jobs_per_s": base,
            "ratio": rate / base,
            "worker_cpu_us_per_job": median([r["worker_cpu_us_per_job"] for r in mine]),
            "without_worker_cpu_us_per_job": median([r["worker_cpu_us_per_job"] for r in theirs]),
            "pruned_during_drain": median([r["pruned_during_drain"] for r in mine]),
            # Pruning had begun before every drain and ran through nearly all of each.
            "pruning_share": min(r["pruning_share"] for r in mine),
            "throughout": all(
                r["pruned_before_drain"] > 0 and r["pruning_share"] >= SHARE_TARGET for r in mine
            ),
            "database_outages": sum(r["database_outages"] for r in runs),
            "pruned_by_keeping": sum(
                r["pruned_before_drain"] + r["pruned_during_drain"] for r in theirs
            ),
            "repeats": {
                "pruning": [r["drain_jobs_per_s"] for r in mine],
                "keeping": [r["drain_jobs_per_s"] for r in theirs],
                "pruned_during_drain": [r["pruned_during_drain"] for r in mine],
            },
        }
    pushed = [r for r in results if r["kind"] == "retention_push"]
    measured = [r for r in results if r["kind"] == "retention_churn"]
    tables: dict[str, dict[str, float]] = {}
    for table in ("fresh", "churned"):
        rows = [r for r in measured if r["table"] == table]
        if rows:
            tables[table] = {
                "claim_p50_ms": median([r["claim"]["p50_ms"] for r in rows]),
                "claim_p99_ms": median([r["claim"]["p99_ms"] for r in rows]),
                "drain_jobs_per_s": median([r["drain_jobs_per_s"] for r in rows]),
                "size_mb": median([r["size_mb"] for r in rows]),
            }
    if pushed and len(tables) == 2:
        fresh, churned = tables["fresh"], tables["churned"]
        diff = {key: _pct(fresh[key], churned[key]) for key in fresh if key != "size_mb"}
        out["churned"] = {
            **{k: v for k, v in pushed[-1].items() if k != "kind"},
            "fresh": fresh,
            "churned": churned,
            "difference_pct": diff,
            # Slower: a higher latency or a lower rate; only that direction counts.
            "within_target": diff["claim_p50_ms"] <= CHURN_TARGET_PCT
            and diff["claim_p99_ms"] <= CHURN_TARGET_PCT
            and diff["drain_jobs_per_s"] >= -CHURN_TARGET_PCT,
        }
    return out


def targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    pruning = section.get("pruning")
    if pruning:
        out.append(
            {
                "target": f"drain while retention prunes {pruning['prefill']:,} old jobs vs "
                f"retention off, pruning through >= {SHARE_TARGET:.0%} of each drain (ratio)",
                "goal": f">= {PRUNE_TARGET:.2f}",
                "measured": pruning["ratio"],
                "met": pruning["ratio"] >= PRUNE_TARGET
                and pruning["throughout"]
                and pruning["database_outages"] == 0,
            }
        )
    churned = section.get("churned")
    if churned:
        out.append(
            {
                "target": f"a table {churned['churn']:,} jobs passed through with retention on "
                f"vs a fresh one, within {CHURN_TARGET_PCT:g}%",
                "goal": "claim p50/p99 and drain",
                "measured": churned["difference_pct"],
                "met": churned["within_target"] and churned["database_outages"] == 0,
            }
        )
        out.append(
            {
                "target": f"retention of the {churned['expired']:,} expired jobs of that table "
                "(RETENTION_COMPLETED=1h, from the worker's start)",
                "goal": f"<= {RETENTION_TARGET_S:g} s",
                "measured": churned["retention_s"],
                "met": churned["retention_s"] <= RETENTION_TARGET_S,
            }
        )
    return out


def lines(section: dict[str, Any]) -> list[str]:
    """The section as text lines for the report."""
    pruning, churned = section.get("pruning"), section.get("churned")
    if not pruning and not churned:
        return []
    out = ["", "Retention"]
    if pruning:
        throughout = (
            ""
            if pruning["throughout"]
            else f"; pruning ran through only {pruning['pruning_share']:.0%} of a drain"
        )
        throughout += step.outages(pruning["database_outages"])
        out += [
            f"  drain of {pruning['jobs']:,} jobs ({pruning['processes']} process(es), "
            f"WORKERS={pruning['workers']}) with {pruning['prefill']:,} completed jobs a day "
            f"old in the table: pruning them (RETENTION_COMPLETED=1s) "
            f"{pruning['jobs_per_s']:,.0f} jobs/s vs keeping them (0) "
            f"{pruning['without_jobs_per_s']:,.0f} jobs/s: {pruning['ratio']:.2f}x "
            f"({pruning['pruned_during_drain']:,.0f} rows pruned during a drain{throughout})",
            "    repeats "
            + " / ".join(f"{v:,.0f}" for v in pruning["repeats"]["pruning"])
            + " vs "
            + " / ".join(f"{v:,.0f}" for v in pruning["repeats"]["keeping"])
            + f"; worker CPU per job {pruning['worker_cpu_us_per_job']:.0f} µs vs "
            f"{pruning['without_worker_cpu_us_per_job']:.0f} µs",
        ]
    if churned:
        verdict = "yes" if churned["within_target"] else "NO"
        out += [
            f"  {churned['churn']:,} jobs through one table with RETENTION_COMPLETED=24h "
            f"({churned['cycled']:,} run by the worker, the others inserted finished over the "
            f"past day, {churned.get('finished_jobs_per_s', 0):,.0f} a second; "
            f"{churned['churn_jobs_per_s']:,.0f} jobs/s in all; all moved to the history "
            f"{churned['all_moved_s']:.0f} s after the first insert; then at "
            f"RETENTION_COMPLETED=1h the {churned['expired']:,} expired jobs pruned in "
            f"{churned['retention_s']:.1f} s from the worker's start, "
            f"{_vacuums(churned)}"
            f"{step.outages(churned['database_outages'])}), then VACUUM ANALYZE, "
            f"vs a fresh table (within {CHURN_TARGET_PCT:g}%: {verdict})",
        ]
        rows = []
        for key, label in (
            ("claim_p50_ms", "claim p50 ms"),
            ("claim_p99_ms", "claim p99 ms"),
            ("drain_jobs_per_s", "drain jobs/s"),
            ("size_mb", "table + indexes MB"),
        ):
            digits = 0 if key == "drain_jobs_per_s" else 2
            diff = churned["difference_pct"].get(key)
            rows.append(
                [
                    label,
                    f"{churned['fresh'][key]:,.{digits}f}",
                    f"{churned['churned'][key]:,.{digits}f}",
                    "" if diff is None else f"{diff:+.1f}%",
                ]
            )
        header = ["", "fresh", "churned", "difference"]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
        out += [
            "    "
            + "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
            for row in [header, *rows]
        ]
    return out


def _vacuums(pushed: dict[str, Any]) -> str:
    if pushed["autovacuum"]:
        return f"{pushed['autovacuum_runs']} autovacuum run(s) meanwhile"
    return (
        "autovacuum off on this server: the harness ran VACUUM "
        f"{pushed['harness_vacuums']} time(s) in its stead"
    )


# --- command line ----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.retention", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--prefill", type=int, help="old completed jobs (default 200000)")
    parser.add_argument("--churn", type=int, help="jobs through the table (default 2000000)")
    parser.add_argument(
        "--cycled", type=int, help="of those, jobs the worker runs (default 400000)"
    )
    parser.add_argument(
        "--churn-rate",
        type=int,
        default=CHURN_RATE,
        help=f"finished jobs inserted per second while churning (default {CHURN_RATE})",
    )
    parser.add_argument("--jobs", type=int, help="jobs per drain (default 20000)")
    parser.add_argument("--repeat", type=int, help="repeats, medians reported (default 3)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument("--server", help="PostgreSQL maintenance URL (default as make bench)")
    args = parser.parse_args(argv)
    quick = args.quick
    prefill = args.prefill if args.prefill is not None else (50_000 if quick else 200_000)
    churn = args.churn if args.churn is not None else (200_000 if quick else 2_000_000)
    cycled = args.cycled if args.cycled is not None else (100_000 if quick else 400_000)
    jobs = args.jobs or (2_000 if quick else 20_000)
    repeat = args.repeat or (1 if quick else 3)
    server = args.server or pg.server_url()
    results: list[dict[str, Any]] = []

    async def run(workdir: Path) -> None:
        rx = await Receiver.open()
        try:
            for rep in range(repeat if prefill else 0):
                for variant in list(RETENTIONS)[:: 1 if rep % 2 == 0 else -1]:
                    figures = await prune_session(
                        server, workdir, rx, args.workers, args.processes,
                        prefill, jobs, 120 + jobs / 20, variant,
                    )  # fmt: skip
                    results.append({**figures, "repeat": rep})
            if churn:
                await churned_sessions(
                    Churned(
                        server,
                        workdir,
                        args.workers,
                        args.processes,
                        churn,
                        cycled,
                        args.churn_rate,
                    ),
                    repeat,
                    measure_options(quick),
                    results,
                )
        finally:
            rx.close()

    with tempfile.TemporaryDirectory(prefix="jobqueue-bench-") as workdir:
        asyncio.run(run(Path(workdir)))
    section = summarize(results)
    return step.report(section, lines, targets)


def measure_options(quick: bool) -> dict[str, Any]:
    """`bench.backlog.measure`'s sizes as `make bench` sets them by default (or --quick)."""
    samples, n, skip, window = (100, 10, 200, 2_000) if quick else (300, 10, 1_000, 20_000)
    return {
        "claim_samples": samples,
        "claim_n": n,
        "skip": skip,
        "window": window,
        "limit": 120 + (window + skip) / 20,
        "use": backlog.consumed(samples, n, skip, window, 2 * 50),
    }


async def churned_sessions(
    churned: Churned, repeat: int, options: dict[str, Any], results: list[dict[str, Any]]
) -> None:
    """Push the jobs through, then measure the fresh and the churned table each repeat."""
    try:
        await churned.push()
        assert churned.pushed is not None
        results.append({"kind": "retention_push", **churned.pushed})
        for rep in range(repeat):
            for table in ("fresh", "churned")[:: 1 if rep % 2 == 0 else -1]:
                results.append(await churned.measure(table, rep, options))
    finally:
        await to_the_end(churned.cleanup())


if __name__ == "__main__":
    sys.exit(main())
