"""What the rollout tests share: a database at a revision, filled like a busy queue, and a
release's statements (`tests.migrations.releases`) run on it as that release ran them, with
their plans read.

A plan is read with `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE` of a statement PREPAREd on
the server, inside a transaction rolled back afterwards, once with `plan_cache_mode =
force_custom_plan` and once with `force_generic_plan`: a worker's or an API process's
prepared statement runs on the generic plan after its fifth execution if that one looks
no costlier, so both must read through an index. (A plain `EXPLAIN` with parameters plans
them as constants whatever `plan_cache_mode` says; EXECUTE of a prepared statement is what
honours it.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

import asyncpg

from jobcore.ids import new_id, new_ids

ROWS = 40_000
# Rows a statement may read from `jobs` (rows returned plus rows filtered out, over every
# loop of every scan of the table), a twentieth of the table: each hot statement reads a
# batch or a page, so reading past this is a scan of the table in all but name.
READ_BUDGET = ROWS // 20
QUEUES, SLOTS = ["default", "mail"], [10, 5]
BATCH = 5  # leases per outcome write, items per batch submit

# Mostly pending jobs (a backlog: the claim's worst case), a tenth of them scheduled for
# later, a few hundred running (a tenth of those with their lease run out), the rest
# finished; the first fiftieth of the jobs were created three days ago (retention has work).
# Columns a revision does not have yet are left out.
_FILL = """
INSERT INTO jobs (id, type, payload, status, attempts, max_attempts, run_at, locked_until,
                  lease_token, last_error, idempotency_key, created_at, updated_at{columns})
SELECT encode(set_byte(b, 6, (get_byte(b, 6) & 15) | 112), 'hex')::uuid,
       CASE WHEN i % 7 = 0 THEN 'report' ELSE 'sleep' END, jsonb_build_object('n', i),
       s.status, CASE s.status WHEN 'pending' THEN 0 WHEN 'dead_letter' THEN 3 ELSE 1 END, 3,
       CASE WHEN s.status = 'pending' AND i % 10 = 9 THEN now() + interval '1 hour'
            ELSE created + interval '1 second' END,
       CASE WHEN s.status <> 'processing' THEN NULL
            WHEN i % 1000 = 55 THEN now() - interval '10 seconds'
            ELSE now() + interval '1 minute' END,
       CASE s.status WHEN 'pending' THEN 0 ELSE 1 END,
       CASE WHEN s.status IN ('failed', 'dead_letter') THEN 'boom' END,
       CASE WHEN i % 10 = 3 THEN 'key-' || i END,
       created, created + interval '5 seconds'{values}
FROM generate_series(1, $1::integer) AS i
CROSS JOIN LATERAL (
    SELECT CASE WHEN i <= $1 / 50 THEN now() - interval '3 days' + i * interval '10 ms'
                ELSE now() - ($1 - i) * interval '100 ms' - interval '10 seconds'
           END AS created,
           CASE WHEN i % 100 < 55 THEN 'pending' WHEN i % 100 = 55 THEN 'processing'
                WHEN i % 100 < 90 THEN 'completed' WHEN i % 100 < 95 THEN 'failed'
                ELSE 'dead_letter' END AS status
) AS s
CROSS JOIN LATERAL (
    SELECT overlay(uuid_send(gen_random_uuid()) PLACING substring(int8send(
        floor(extract(epoch FROM s.created) * 1000)::bigint) FROM 3) FROM 1 FOR 6) AS b
) AS ids
"""
_LATER_COLUMNS = {
    # column: its value in the fill, from the revision that added it
    "queue": "CASE WHEN i % 5 = 0 THEN 'mail' ELSE 'default' END",
    "priority": "(i % 3 - 1) * 5",
    "finished_at": "CASE WHEN s.status IN ('completed', 'failed', 'dead_letter')"
    " THEN created + interval '5 seconds' END",
}


async def connect(url: str, search_path: str = "jobqueue") -> asyncpg.Connection:
    """A connection whose unqualified names (the fill, the checks, a release's statements)
    find `jobs` in `search_path`: `jobqueue` for a database this release migrated; `public`
    for the layout of the releases before 0008 (and the views 0008 leaves there)."""
    return await asyncpg.connect(url, server_settings={"search_path": search_path})


def previous_layout(url: str) -> None:
    """An empty database at 0007 as the release at 0007 migrated it: its tables in
    `public`, its revision in `public.alembic_version`, no schema of jobqueue's (0001-0007
    run in the schema, then everything moved to where that release kept it)."""
    import psycopg
    from alembic import command

    from tests import pg

    command.upgrade(pg.alembic_config(url), "0007")
    with psycopg.connect(url, autocommit=True) as conn:
        for (table,) in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'jobqueue'"
            " AND tablename <> 'alembic_version'"
        ).fetchall():
            conn.execute(f"ALTER TABLE jobqueue.{table} SET SCHEMA public")
        conn.execute(
            "CREATE TABLE public.alembic_version (version_num varchar(32) NOT NULL,"
            " CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))"
        )
        conn.execute("INSERT INTO public.alembic_version VALUES ('0007')")
        conn.execute("DROP SCHEMA jobqueue CASCADE")


async def columns(conn: asyncpg.Connection) -> set[str]:
    rows = await conn.fetch(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'jobs'"
        " AND table_schema = current_schema()"
    )
    return {row[0] for row in rows}


async def fill(conn: asyncpg.Connection) -> None:
    """ROWS jobs (see _FILL), vacuumed and analysed (autovacuum may be off)."""
    present = [name for name in _LATER_COLUMNS if name in await columns(conn)]
    sql = _FILL.format(
        columns="".join(f", {name}" for name in present),
        values="".join(f", {_LATER_COLUMNS[name]}" for name in present),
    )
    await conn.execute(sql, ROWS)
    await conn.execute("VACUUM ANALYZE jobs")


# --- running a release's statements ----------------------------------------------------


@dataclass(frozen=True)
class Statement:
    """One statement of a release, as `releases` stored it."""

    name: str
    sql: str
    params: list[tuple[str, bool, Any]]  # (name, supplied by the caller, else its value)

    @classmethod
    def of(cls, name: str, stored: Mapping[str, Any]) -> Statement:
        return cls(name, stored["sql"], [(p[0], p[1], p[2]) for p in stored["params"]])

    @property
    def parameters(self) -> set[str]:
        return {name for name, supplied, _ in self.params if supplied}

    def args(self, values: Mapping[str, Any]) -> list[Any]:
        missing = sorted(self.parameters - set(values))
        if missing:
            raise KeyError(
                f"{self.name}: no value for {missing}; add them to tests/migrations/rollout.py"
            )
        return [values[name] if supplied else fixed for name, supplied, fixed in self.params]

    async def fetch(self, conn: asyncpg.Connection, values: Mapping[str, Any]) -> list[Any]:
        return list(await conn.fetch(self.sql, *self.args(values)))


def statements(stored: Mapping[str, Any]) -> dict[str, Statement]:
    return {name: Statement.of(name, s) for name, s in stored["statements"].items()}


def uuid7_at(epoch_ms: int) -> UUID:
    """A time-ordered id (as `jobcore.ids` makes them) for a job created at that time."""
    random = new_id().int & ((1 << 80) - 1)
    return UUID(int=(epoch_ms & 0xFFFF_FFFF_FFFF) << 80 | random)


async def values(conn: asyncpg.Connection, name: str) -> dict[str, Any]:
    """Parameters for statement `name` of any release, on a filled table: real leases of
    running jobs, real keys, a new job to submit."""
    leases = await conn.fetch(
        "SELECT id, lease_token FROM jobs WHERE status = 'processing'"
        " AND locked_until > now() ORDER BY id LIMIT $1",
        BATCH,
    )
    ids, tokens = [r[0] for r in leases], [r[1] for r in leases]
    base: dict[str, Any] = {
        "age": 86400.0,
        "claim": uuid4(),
        "holder": "rollout-host:1",
        "key_limits": [],
        "turn_queues": [],
        "turn_priorities": [],
        "turns": [],
        "overrun_queues": [],
        "overrun_keys": [],
        "overrun_counts": [],
        "token": "rollout",
        "locked_queues": [],
        "claim_ids": [uuid4()],
        "lease_seconds": 30.0,
        "n": 10,
        "queues": QUEUES,
        "slots": SLOTS,
        "limited": ["report"],
        "floor_queues": [],
        "floor_priorities": [],
        "floors": [],
        "key_floor_queues": [],
        "key_floor_priorities": [],
        "key_floor_keys": [],
        "key_floors": [],
        "key_lease_floor": None,
        "window": None,
        "ids": ids,
        "tokens": tokens,
        "errors": ["boom"] * len(ids),
        "tracebacks": ["Traceback (most recent call last):"] * len(ids),
        "delays": [1.0] * len(ids),
        "results": ['{"ok": true}'] * len(ids),
        "keys": ["key-3", "key-13", "key-missing"],
        # a job to read: one of the fill's
        "id": await conn.fetchval("SELECT id FROM jobs WHERE status = 'pending' LIMIT 1"),
    }
    if name in ("claim_limited", "lock_types"):
        base.update(types=["report"], concurrency=[5], overruns=[0], rates=[100], periods=[1.0])
    elif name.startswith(("submit_many", "submit_group")):
        new = new_ids(BATCH)
        base.update(
            ids=new,
            types=["sleep"] * BATCH,
            payloads=[json.dumps({"item": i}) for i in range(BATCH)],
            max_attempts=[3] * BATCH,
            keys=[f"batch-{job}" for job in new],
            queues=["default"] * BATCH,
            priorities=[0] * BATCH,
            timeouts=[None] * BATCH,
            concurrency_keys=[None] * BATCH,
            traceparents=[None] * BATCH,
            not_befores=[None] * BATCH,
            delays=[None] * BATCH,
        )
        if name != "submit_many":  # one value for the batch where the items share it
            base.update(
                {key: None for key in ("types", "max_attempts", "queues", "priorities")},
                shared_type="sleep",
                shared_max_attempts=3,
                shared_queue="default",
                shared_priority=0,
                shared_timeout=None,
                shared_concurrency_key=None,
                shared_traceparent=None,
                shared_delay=None,
                shared_not_before=None,
            )
    elif name.startswith("submit"):
        base.update(new_job())
    return base


def new_job(job_id: UUID | None = None, key: str | None = None) -> dict[str, Any]:
    """A submit's parameters, by every name a release gave them."""
    return {
        "id": job_id or new_id(),
        "type": "sleep",
        "payload": json.dumps({"rollout": True}),
        "max_attempts": 3,
        "idempotency_key": key,
        "queue": "default",
        "priority": 0,
        "timeout": None,
        "concurrency_key": None,
        "traceparent": None,
        "not_before": None,
        "delay": None,
    }


# --- plans ------------------------------------------------------------------------------


def nodes(plan: Any) -> Iterator[dict[str, Any]]:
    """Every node of a JSON plan, depth first."""
    stack: list[Any] = [plan]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "Node Type" in node:
                yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


_SCANS = {"Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan"}


@dataclass(frozen=True)
class Reading:
    """How one execution of a statement read the jobs table."""

    plan: Any
    seq_scans: int
    rows_read: int

    def problems(self, budget: int = READ_BUDGET) -> list[str]:
        found = []
        if self.seq_scans:
            found.append(f"{self.seq_scans} Seq Scan(s) on jobs")
        if self.rows_read > budget:
            found.append(f"reads {self.rows_read} rows of jobs (budget {budget})")
        return found


def reading(plan: Any) -> Reading:
    seq, read = 0, 0
    for node in nodes(plan):
        if node["Node Type"] not in _SCANS or node.get("Relation Name") != "jobs":
            continue
        seq += node["Node Type"] == "Seq Scan"
        per_loop = (
            node.get("Actual Rows", 0)
            + node.get("Rows Removed by Filter", 0)
            + node.get("Rows Removed by Index Recheck", 0)
        )
        read += round(per_loop * node.get("Actual Loops", 1))
    return Reading(plan, seq, read)


async def explain(
    conn: asyncpg.Connection, statement: Statement, args: Sequence[Any], *, generic: bool
) -> Reading:
    """Run `statement` once, rolled back, and read its plan (see the module docstring)."""
    prepared = await conn.prepare(statement.sql)
    types = [
        await conn.fetchval("SELECT format_type($1::oid, NULL)", t.oid)
        for t in prepared.get_parameters()
    ]
    literals = [
        f"CAST({await conn.fetchval(f'SELECT quote_nullable(CAST($1 AS {t}))', a)} AS {t})"
        for a, t in zip(args, types, strict=True)
    ]
    mode = "force_generic_plan" if generic else "force_custom_plan"
    execute = "EXECUTE rollout_statement" + (f"({', '.join(literals)})" if literals else "")
    await conn.execute(f"PREPARE rollout_statement AS {statement.sql}")
    try:
        tr = conn.transaction()
        await tr.start()
        try:
            await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
            plan = await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {execute}")
        finally:
            await tr.rollback()
    finally:
        await conn.execute("DEALLOCATE rollout_statement")
    return reading(json.loads(plan) if isinstance(plan, str) else plan)


async def problems(conn: asyncpg.Connection, found: Mapping[str, Statement]) -> dict[str, Any]:
    """Every statement whose custom or generic plan scans jobs or reads past the budget:
    {name: [(plan kind, problems, plan)]}."""
    out: dict[str, Any] = {}
    for name, statement in sorted(found.items()):
        args = statement.args(await values(conn, name))
        for generic in (False, True):
            read = await explain(conn, statement, args, generic=generic)
            if read.problems():
                kind = "generic" if generic else "custom"
                out.setdefault(name, []).append((kind, read.problems(), read.plan))
    return out
