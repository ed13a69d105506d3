"""What `make bench-pressure` does to the system and reads from it: the fixed-rate producer,
the two horizon holders, the once-a-second sampler, and the database reads done after a
scenario (completions per second, run_at of the sampled jobs, the relations' dead tuples
and sizes). Every statement names the jobs table as `jobcore.schema` qualifies it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg
from sqlalchemy.dialects import postgresql

from bench.adapters.ours_jobs import JOB_TYPE
from bench.beacon import Receiver
from bench.http import HttpError, Pool
from bench.pressure_report import PHASES
from bench.stats import median
from jobcore import schema
from jobcore.states import Status

TICK = 0.05  # seconds between batches
MARK_EVERY = 10  # one job in this many reports its handler start (bench.beacon)
# Batches in flight at once: a slow answer must not hold back the next tick's batch.
SENDERS = 8
READER_SESSIONS = 4
READ_EVERY = 0.1  # seconds between a repeatable-read session's counts
SAMPLE_EVERY = 1.0


def qualified(table: Any) -> str:
    """The table's name as SQL, with its schema if it gets one."""
    dialect: Any = postgresql.dialect
    return str(dialect().identifier_preparer.format_table(table))


JOBS = qualified(schema.jobs)
# Every job kept, wherever it is: the workers move completed jobs to `jobs_history` (the
# same columns, in the same order) a minute after they finish.
RETAINED = f"(SELECT * FROM {JOBS} UNION ALL SELECT * FROM {qualified(schema.jobs_history)})"
TABLES = [qualified(t) for t in schema.metadata.sorted_tables]
PENDING = f"SELECT count(*) FROM {JOBS} WHERE status = '{Status.PENDING.value}'"
# Vacuums are counted as they finish (manual, as the harness's stand-in runs them, or auto).
JOBS_DEAD = """
SELECT n_dead_tup, vacuum_count + autovacuum_count AS vacuums
FROM pg_stat_user_tables WHERE relid = to_regclass($1)
"""
RELATIONS = """
WITH t AS (SELECT to_regclass(name) AS oid FROM unnest($1::text[]) AS name)
SELECT c.oid::regclass::text AS name,
       CASE WHEN c.relkind IN ('i', 'I') THEN 'index' ELSE 'table' END AS kind,
       s.n_dead_tup, pg_relation_size(c.oid) AS bytes
FROM pg_class AS c LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid IN (SELECT oid FROM t)
   OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid IN (SELECT oid FROM t))
ORDER BY kind DESC, name
"""
# The jobs table's name as RELATIONS names it.
JOBS_RELATION = "SELECT to_regclass($1)::text"
# finished_at is the completing transaction's now(): the database's clock, which is this
# machine's wall clock, as time.time() is.
COMPLETIONS = f"""
SELECT floor(extract(epoch FROM finished_at)::float8 - $1::float8)::int AS s, count(*)::int
FROM {RETAINED} AS jobs
WHERE status = '{Status.COMPLETED.value}'
  AND finished_at >= to_timestamp($1) AND finished_at < to_timestamp($2)
GROUP BY 1
"""
RUN_AT = (
    f"SELECT id::text, extract(epoch FROM run_at)::float8 FROM {RETAINED} AS jobs"
    " WHERE id = ANY($1)"
)


class Producer:
    """POST /jobs/batch every TICK, each batch holding what the rate owes since the last one.

    Ticks are scheduled by absolute time and each batch is sent by a task of its own (at
    most SENDERS at once), so a slow answer or a late wake-up delays no later batch: over
    a phase the offered count is rate x seconds. One job in MARK_EVERY carries a beacon
    marker; its handler's start time and its id are kept for the claim latency."""

    def __init__(self, pool: Pool, rx: Receiver, rate: float) -> None:
        self.pool, self.rx, self.rate = pool, rx, rate
        self.phase = PHASES[0]
        self.offered: Counter[str] = Counter()
        self.accepted: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.errors: list[str] = []
        self.request_s: defaultdict[str, list[float]] = defaultdict(list)
        self.marked: list[tuple[asyncio.Future[tuple[float, int]], str]] = []
        self._jobs = 0
        self._senders = asyncio.Semaphore(SENDERS)
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        origin, owed, ticks = loop.time(), 0.0, 0
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(max(0.0, origin + ticks * TICK - loop.time()))
            owed += self.rate * TICK
            n = int(owed + 1e-9)  # 1e-9: 0.05 x 800 must make 40, not 39.999...
            owed -= n
            if n:
                task = asyncio.create_task(self._send(n, self.phase))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        await asyncio.gather(*self._tasks)

    async def _send(self, n: int, phase: str) -> None:
        items, markers = [], []
        for i in range(n):
            payload: dict[str, Any] = {}
            if self._jobs % MARK_EVERY == 0:
                marker = f"p{self._jobs}"
                markers.append((i, self.rx.expect(marker)))
                payload = self.rx.payload(marker)
            self._jobs += 1
            items.append({"type": JOB_TYPE, "payload": payload})
        self.offered[phase] += n
        body = json.dumps({"jobs": items}).encode()
        # From the tick, so the time spent waiting for a free sender counts too.
        started = time.perf_counter()
        async with self._senders:
            try:
                status, answer = await self.pool.request("POST", "/jobs/batch", body)
            except (OSError, HttpError, asyncio.IncompleteReadError) as exc:
                status, answer = 0, repr(exc).encode()
            self.request_s[phase].append(time.perf_counter() - started)
        if status != 200:
            self.failed[phase] += n
            if len(self.errors) < 10:
                self.errors.append(f"{status}: {answer[:200]!r}")
            return
        results = json.loads(answer)["results"]
        self.accepted[phase] += sum(1 for r in results if r["status"] == "created")
        self.marked += [(future, results[i]["id"]) for i, future in markers]


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or until `stop` is set if that comes first."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, seconds))


async def hold_idle_xid(url: str, stop: asyncio.Event) -> dict[str, Any]:
    """One session with an xid assigned, idle in its transaction until `stop`."""
    conn = await asyncpg.connect(url)
    try:
        transaction = conn.transaction()
        await transaction.start()
        xid = await conn.fetchval("SELECT txid_current()")
        await stop.wait()
        await transaction.rollback()
    finally:
        await conn.close()
    return {"sessions": 1, "xid": int(xid)}


async def hold_repeatable_read(url: str, stop: asyncio.Event) -> dict[str, Any]:
    """READER_SESSIONS sessions, each in one REPEATABLE READ transaction, counting the jobs
    table every READ_EVERY seconds until `stop` (a count that overruns its period skips
    the periods it missed: a session runs one statement at a time)."""

    async def session() -> list[float]:
        conn = await asyncpg.connect(url)
        took: list[float] = []
        try:
            transaction = conn.transaction(isolation="repeatable_read")
            await transaction.start()
            loop = asyncio.get_running_loop()
            due = loop.time()
            while not stop.is_set():
                started = time.perf_counter()
                await conn.fetchval(f"SELECT count(*) FROM {JOBS}")
                took.append(time.perf_counter() - started)
                due = max(due + READ_EVERY, loop.time())
                await _pause(stop, due - loop.time())
            await transaction.rollback()
        finally:
            await conn.close()
        return took

    took = [
        t for one in await asyncio.gather(*(session() for _ in range(READER_SESSIONS))) for t in one
    ]
    return {
        "sessions": READER_SESSIONS,
        "counts": len(took),
        "count_median_ms": round(median(took) * 1000, 1) if took else None,
        "count_max_ms": round(max(took) * 1000, 1) if took else None,
    }


class Sampler:
    """Every SAMPLE_EVERY seconds, on a connection of its own: the pending jobs, the jobs
    table's dead tuples and the vacuums of it finished so far, with the time and the phase."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.phase = PHASES[0]
        self.samples: list[dict[str, Any]] = []

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while not stop.is_set():
            at = time.time()
            pending = int(await self.conn.fetchval(PENDING))
            dead, vacuums = await self.conn.fetchrow(JOBS_DEAD, JOBS)
            self.samples.append(
                {
                    "at": at,
                    "phase": self.phase,
                    "pending": pending,
                    "dead": dead,
                    "vacuums": vacuums,
                }
            )
            due = max(due + SAMPLE_EVERY, loop.time())
            await _pause(stop, due - loop.time())


async def relations(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """Every table of jobcore's schema and each of their indexes: dead tuples (tables only:
    PostgreSQL counts none for indexes) and size in bytes."""
    rows = await conn.fetch(RELATIONS, TABLES)
    return [
        {
            "name": r["name"],
            "kind": r["kind"],
            "n_dead_tup": int(r["n_dead_tup"] or 0) if r["kind"] == "table" else None,
            "bytes": int(r["bytes"]),
        }
        for r in rows
    ]


async def completions(conn: asyncpg.Connection, start: float, end: float) -> dict[int, int]:
    """Jobs completed in each second since `start`, up to `end`: {second: count}."""
    return {int(s): int(n) for s, n in await conn.fetch(COMPLETIONS, start, end)}


async def handler_starts(
    conn: asyncpg.Connection, marked: Sequence[tuple[asyncio.Future[tuple[float, int]], str]]
) -> tuple[list[tuple[float, float]], int]:
    """(handler start, handler start − run_at) of every sampled job that started, and how
    many had not started."""
    started = {job: future.result()[0] for future, job in marked if future.done()}
    run_at: Mapping[str, float] = dict(await conn.fetch(RUN_AT, list(started)))
    return [(at, at - run_at[job]) for job, at in started.items()], len(marked) - len(started)
