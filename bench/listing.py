"""What a list page (`GET /jobs`) and the queue depths (`GET /queues`) cost on a big table.

    python -m bench.listing [--rows N] [--samples S]    (also a step of `make bench`)

A fresh database migrated to head gets `rows` jobs from one `INSERT ... SELECT
generate_series` (`FILL`): ten days of time-ordered ids (UUID version 7, built in
SQL from each job's creation time, as `jobcore.ids` builds them), five types and
three queues in uneven shares, about 92% completed, 3% failed, 1% dead_letter,
1% cancelled, and among the newest 5% pending (a tenth of them scheduled for
later) and processing jobs; then VACUUM ANALYZE, as autovacuum would have run on
a table this size. Each filter combination of `COMBOS` is then timed, round-robin
so background noise spreads evenly, `samples` times on a first page and on a deep
page (the cursor at the middle of the jobs it matches) of `LIMIT` jobs, through
`jobcore.search.list_jobs` on one SQLAlchemy connection in this process: the
statement as the API runs it, without HTTP. `queue_depths` is timed alike. Also
recorded: the indexes each combination's page reads (its plan).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from bench import pg, step
from bench.adapters.base import to_the_end
from bench.adapters.ours import Ours
from bench.stats import latency_ms
from jobcore import search
from jobcore.runner import Compiled
from jobcore.schema import jobs
from jobcore.search import Filters
from jobcore.states import Status

LIMIT = 50
TARGET_P99_MS = 20.0  # a page, with a million rows
TARGET_ROWS = 1_000_000  # the table size the target is stated for

# $1: how many jobs. Shares come from hashes of the row number, so every fill of a size
# holds the same mix.
FILL = """
INSERT INTO jobqueue.jobs (id, type, payload, status, attempts, max_attempts, run_at, locked_until,
                  lease_token, last_error, queue, finished_at, created_at, updated_at)
SELECT encode(set_byte(b, 6, (get_byte(b, 6) & 15) | 112), 'hex')::uuid,
       (ARRAY['email', 'webhook', 'thumbnail', 'report', 'export'])[
           CASE WHEN t < 400 THEN 1 WHEN t < 700 THEN 2 WHEN t < 850 THEN 3
                WHEN t < 950 THEN 4 ELSE 5 END],
       jsonb_build_object('n', g, 'to', 'user' || g % 9973 || '@example.com',
                          'subject', 'Order ' || g || ' shipped'),
       st,
       CASE WHEN st = 'pending' THEN 0 WHEN st = 'dead_letter' THEN 5 ELSE 1 END,
       5,
       CASE WHEN st = 'pending' AND s < 50 THEN created + interval '1 hour' ELSE created END,
       CASE WHEN st = 'processing' THEN now() + interval '5 minutes' END,
       CASE WHEN st = 'pending' THEN 0 ELSE 1 END,
       CASE WHEN st IN ('failed', 'dead_letter') THEN 'TimeoutError: no answer in 30 s' END,
       CASE WHEN q < 700 THEN 'default' WHEN q < 900 THEN 'bulk' ELSE 'critical' END,
       CASE WHEN st NOT IN ('pending', 'processing') THEN created + interval '2 seconds' END,
       created,
       created + CASE WHEN st = 'pending' THEN interval '0' ELSE interval '2 seconds' END
FROM generate_series(1, $1::bigint) AS g,
LATERAL (SELECT now() - interval '10 days' + g * (interval '10 days' / $1::bigint) AS created,
                (hashint8extended(g, 1) & 2147483647) % 1000 AS s,
                (hashint8extended(g, 2) & 2147483647) % 1000 AS t,
                (hashint8extended(g, 3) & 2147483647) % 1000 AS q) AS draws,
LATERAL (SELECT overlay(uuid_send(gen_random_uuid())
                        PLACING substring(int8send(floor(extract(epoch FROM created) * 1000)
                                                   ::bigint) FROM 3)
                        FROM 1 FOR 6) AS b,
                CASE WHEN g > $1::bigint * 0.95 AND s < 500 THEN 'pending'
                     WHEN g > $1::bigint * 0.95 AND s < 520 THEN 'processing'
                     WHEN s % 100 < 3 THEN 'failed'
                     WHEN s % 100 = 3 THEN 'dead_letter'
                     WHEN s % 100 = 4 THEN 'cancelled'
                     ELSE 'completed' END AS st) AS derived
"""

_P, _R, _C, _F, _D, _X = (
    Status.PENDING,
    Status.PROCESSING,
    Status.COMPLETED,
    Status.FAILED,
    Status.DEAD_LETTER,
    Status.CANCELLED,
)
TYPE, QUEUE = "report", "critical"  # a tenth of the jobs each
# Named as the query string of `GET /jobs` that asks for them.
COMBOS: dict[str, Filters] = {
    "(none)": Filters(),
    **{f"status={s}": Filters(statuses=[s]) for s in Status},
    "status=pending,failed,dead_letter": Filters(statuses=[_P, _F, _D]),
    f"type={TYPE}": Filters(type=TYPE),
    f"queue={QUEUE}": Filters(queue=QUEUE),
    f"type={TYPE}&queue={QUEUE}": Filters(type=TYPE, queue=QUEUE),
    f"status=failed&type={TYPE}": Filters(statuses=[_F], type=TYPE),
    f"status=failed&queue={QUEUE}": Filters(statuses=[_F], queue=QUEUE),
    f"status=failed&type={TYPE}&queue={QUEUE}": Filters(statuses=[_F], type=TYPE, queue=QUEUE),
    f"status=completed&type={TYPE}&queue={QUEUE}": Filters(statuses=[_C], type=TYPE, queue=QUEUE),
}
PAGES = ("first", "deep")


async def fill(ours: Ours, rows: int) -> None:
    assert ours.sql.conn is not None
    await ours.sql.conn.execute(FILL, rows, timeout=3600)
    await ours.sql.conn.execute("VACUUM ANALYZE jobqueue.jobs", timeout=3600)


def _where(filters: Filters) -> list[Any]:
    c = jobs.c
    where = []
    if filters.statuses is not None:
        where.append(c.status.in_([s.value for s in filters.statuses]))
    if filters.type is not None:
        where.append(c.type == filters.type)
    if filters.queue is not None:
        where.append(c.queue == filters.queue)
    return where


async def middle(conn: AsyncConnection, filters: Filters) -> UUID:
    """The deep page's cursor: the middle of the jobs `filters` match, or of the table when
    fewer than two match."""
    for where in (_where(filters), []):
        count = await conn.scalar(sa.select(sa.func.count()).select_from(jobs).where(*where))
        if count and count >= 2:
            found = await conn.scalar(
                sa.select(jobs.c.id)
                .where(*where)
                .order_by(jobs.c.id.desc())
                .offset(count // 2)
                .limit(1)
            )
            return UUID(str(found))
    raise RuntimeError("the table holds fewer than two jobs")


async def indexes(conn: AsyncConnection, filters: Filters) -> list[str]:
    """The indexes the first page's plan reads, as the planner chose for this table."""
    statement = Compiled(search.list_statement(filters, after=False))
    raw = (await conn.get_raw_connection()).driver_connection
    args = statement.args({"limit": LIMIT + 1, "type": filters.type, "queue": filters.queue})
    plan = await raw.fetchval(f"EXPLAIN (FORMAT JSON) {statement.sql}", *args)
    found: set[str] = set()
    stack: list[Any] = [json.loads(plan) if isinstance(plan, str) else plan]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("Node Type") == "Seq Scan":
                found.add(f"Seq Scan on {node.get('Relation Name')}")
            elif "Index Name" in node:
                found.add(node["Index Name"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return sorted(found)


async def measure(engine: AsyncEngine, samples: int) -> dict[str, Any]:
    """p50/p99 of each combination's pages and of `queue_depths`, in milliseconds."""
    async with engine.connect() as conn:
        cursors = {name: await middle(conn, filters) for name, filters in COMBOS.items()}
        plans = {name: await indexes(conn, filters) for name, filters in COMBOS.items()}
        await conn.rollback()
        durations: dict[tuple[str, str], list[float]] = {
            (name, page): [] for name in COMBOS for page in PAGES
        }
        depths: list[float] = []
        found: dict[tuple[str, str], int] = {}
        for round_ in range(samples + 3):  # 3 rounds of warm-up, not kept
            for name, filters in COMBOS.items():
                for page in PAGES:
                    before = cursors[name] if page == "deep" else None
                    started = time.perf_counter()
                    page_jobs, _ = await search.list_jobs(conn, filters, LIMIT, before)
                    elapsed = time.perf_counter() - started
                    if round_ >= 3:
                        durations[name, page].append(elapsed)
                    found[name, page] = len(page_jobs)
            started = time.perf_counter()
            await search.queue_depths(conn)
            if round_ >= 3:
                depths.append(time.perf_counter() - started)
            await conn.rollback()  # no snapshot held across rounds
        counts = await conn.execute(
            sa.select(jobs.c.status, sa.func.count()).group_by(jobs.c.status)
        )
        statuses = {status: int(n) for status, n in counts}
    return {
        "combos": {
            name: {
                "indexes": plans[name],
                **{
                    page: {
                        **_figures(latency_ms(durations[name, page])),
                        "jobs": found[name, page],
                    }
                    for page in PAGES
                },
            }
            for name in COMBOS
        },
        "queue_depths": _figures(latency_ms(depths)),
        "statuses": statuses,
    }


def _figures(latency: dict[str, float]) -> dict[str, float]:
    return {key: latency[key] for key in ("p50_ms", "p99_ms", "samples")}


async def session(server: str, workdir: Path, rows: int, samples: int) -> dict[str, Any]:
    """A fresh database with `rows` jobs, measured, then dropped."""
    ours = Ours(server, workdir, 1)
    try:
        await ours.prepare()
        started = time.perf_counter()
        await fill(ours, rows)
        filled = time.perf_counter() - started
        figures = await measure(ours.engine, samples)
    finally:
        await to_the_end(ours.cleanup())
    return {"kind": "listing", "rows": rows, "limit": LIMIT, "fill_seconds": filled, **figures}


# --- summary -------------------------------------------------------------------------


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The one listing run, with its worst page p99 (the figure the target is about)."""
    runs = [r for r in results if r["kind"] == "listing"]
    if not runs:
        return {}
    run = {key: value for key, value in runs[-1].items() if key != "kind"}
    worst = max(
        (combo[page]["p99_ms"], f"{name} ({page} page)")
        for name, combo in run["combos"].items()
        for page in PAGES
    )
    return {**run, "worst_p99_ms": worst[0], "worst": worst[1]}


def targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    if not section:
        return []
    return [
        {
            "target": f"list page of {section['limit']} p99, every filter, first and deep page, "
            f"{section['rows']:,} jobs (ms)",
            "goal": f"< {TARGET_P99_MS:g}"
            + ("" if section["rows"] >= TARGET_ROWS else f" (stated for {TARGET_ROWS:,})"),
            "measured": section["worst_p99_ms"],
            "met": section["worst_p99_ms"] < TARGET_P99_MS,
        }
    ]


def lines(section: dict[str, Any]) -> list[str]:
    """The section as text lines for the report."""
    if not section:
        return []
    header = ["GET /jobs?", "first p50/p99 ms", "deep p50/p99 ms", "indexes read"]
    rows = [
        [
            name,
            *(f"{combo[page]['p50_ms']:.2f}/{combo[page]['p99_ms']:.2f}" for page in PAGES),
            ", ".join(i.removeprefix("jobs_") for i in combo["indexes"]),
        ]
        for name, combo in section["combos"].items()
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    table = [
        "  "
        + "  ".join(
            c.ljust(w) if i in (0, 3) else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    ]
    depths = section["queue_depths"]
    return [
        "",
        f"Listing: {section['rows']:,} jobs, pages of {section['limit']} through "
        f"jobcore.search.list_jobs in process, {depths['samples']:,} samples each "
        f"(worst p99 {section['worst_p99_ms']:.2f} ms: {section['worst']})",
        *table,
        f"  queue_depths: p50 {depths['p50_ms']:.2f} ms, p99 {depths['p99_ms']:.2f} ms",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.listing", description=__doc__)
    parser.add_argument("--rows", type=int, default=TARGET_ROWS)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--server", help="PostgreSQL maintenance URL (default as make bench)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="jobqueue-bench-") as workdir:
        result = asyncio.run(
            session(args.server or pg.server_url(), Path(workdir), args.rows, args.samples)
        )
    section = summarize([result])
    return step.report(section, lines, targets)


if __name__ == "__main__":
    sys.exit(main())
