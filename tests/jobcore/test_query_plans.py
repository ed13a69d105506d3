"""The hot queries read the partial indexes built for them, in custom and generic plans.

A future edit that stops the planner from proving the index predicate (a status
sent as a parameter, an OR, a different ORDER BY) turns a claim into a scan of
the whole table; these tests catch that.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from jobcore import queries, store
from jobcore.compiled import NO_FLOORS, NO_OVERRUNS, NO_TURNS
from jobcore.floors import TypeFloors, micros
from jobcore.ids import new_id
from jobcore.rows import NewJob
from jobcore.runner import Compiled
from jobcore.schema import jobs
from tests import pg
from tests.pg import driver


async def _fill(engine) -> None:
    """Mostly finished rows, some pending, a few processing: a realistic hot table."""
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                """
                INSERT INTO jobqueue.jobs (id, type, payload, status, attempts, max_attempts,
                                  locked_until, run_at)
                SELECT gen_random_uuid(), 'sleep', '{}',
                       CASE WHEN i % 50 = 0 THEN 'pending'
                            WHEN i % 97 = 0 THEN 'processing' ELSE 'completed' END,
                       1, 3,
                       CASE WHEN i % 50 <> 0 AND i % 97 = 0 THEN now() + interval '1 minute' END,
                       now() - interval '1 second'
                FROM generate_series(1, 20000) AS i
                """
            )
        )
        await conn.execute(sa.text("ANALYZE jobqueue.jobs"))


async def _plan(engine, statement, params: dict, generic: bool) -> str:
    async with engine.connect() as conn:
        compiled = Compiled(statement)
        plan = await pg.explain(
            await driver(conn), compiled.sql, compiled.args(params), generic=generic
        )
        await conn.rollback()
    return plan if isinstance(plan, str) else json.dumps(plan)


def _nodes(plan: str) -> Iterator[dict]:
    """Every node of a JSON plan, depth first."""
    stack: list = [json.loads(plan)]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _index_scans(plan: str) -> set[str]:
    return {node["Index Name"] for node in _nodes(plan) if "Index Name" in node}


# A claim from the head (a sweep), and one from floors: one known priority of each queue,
# and two known keys of one.
FLOORED = {
    "floor_queues": ["default", "other"],
    "floor_priorities": [0, 5],
    "floors": [micros(datetime.now(UTC) - timedelta(minutes=1))] * 2,
    "key_floor_queues": ["default", "default"],
    "key_floor_priorities": [0, 0],
    "key_floor_keys": ["k1", "k2"],
    "key_floors": [micros(datetime.now(UTC) - timedelta(minutes=1))] * 2,
    "key_lease_floor": micros(datetime.now(UTC) - timedelta(minutes=1)),
}
FLOORS = pytest.mark.parametrize("floors", [NO_FLOORS, FLOORED], ids=["sweep", "floored"])


@FLOORS
@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_claim_reads_the_partial_claim_index(engine, generic, floors):
    """From the head, from the floors, and from the keys' floors too when floored."""
    await _fill(engine)
    plan = await _plan(
        engine,
        queries.JOB_CLAIM_KEY_FLOORS if floors is FLOORED else queries.JOB_CLAIM,
        {
            "queues": ["default", "other"],
            "slots": [10, 5],
            "lease_seconds": 60.0,
            "claim": new_id(),
            "holder": "plan-host:1",
            "key_limits": [],
            **NO_OVERRUNS,
            **NO_TURNS,
            **floors,
        },
        generic,
    )
    assert "jobs_claim_key_idx" in _index_scans(plan), plan
    assert '"Seq Scan"' not in plan, plan


@FLOORS
@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_next_due_reads_the_claim_index(engine, generic, floors):
    await _fill(engine)
    plan = await _plan(
        engine, queries.JOB_NEXT_DUE, {"queues": ["default", "other"], **floors}, generic
    )
    assert _index_scans(plan) == {"jobs_claim_key_idx"}, plan
    assert '"Seq Scan"' not in plan, plan


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_the_first_key_lease_is_read_from_the_running_jobs_only(engine, generic):
    """In lease order, or by queue among the running jobs with a key: either way off the
    claims' path, and never through the pending or finished jobs."""
    await _fill(engine)
    params = {"queues": ["default", "other"], "key_lease_floor": FLOORED["key_lease_floor"]}
    plan = await _plan(engine, queries.JOB_KEY_LEASE_FIRST, params, generic)
    assert _index_scans(plan) in ({"jobs_lease_idx"}, {"jobs_key_lease_idx"}), plan
    assert '"Seq Scan"' not in plan, plan


@FLOORS
@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_the_check_of_the_heads_reads_the_claim_index(engine, generic, floors):
    await _fill(engine)
    params = {"queues": ["default", "other"], **NO_FLOORS, **floors}
    plan = await _plan(engine, queries.JOB_CLAIM_HEADS, params, generic)
    assert _index_scans(plan) == {"jobs_claim_key_idx"}, plan
    assert '"Seq Scan"' not in plan, plan


async def test_jobs_not_yet_due_at_a_higher_priority_cost_a_claim_nothing(engine):
    """20,000 jobs scheduled for later at high priorities sit ahead of the due ones in the
    claim index: the claim must step over them by priority, not read them one by one."""
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO jobqueue.jobs (id, type, payload, max_attempts, priority, run_at)"
                " SELECT gen_random_uuid(), 'sleep', '{}', 3, 10 + i % 50,"
                " now() + interval '1 hour' FROM generate_series(1, 20000) AS i"
            )
        )
        await conn.execute(
            sa.text(
                "INSERT INTO jobqueue.jobs (id, type, payload, max_attempts, run_at) SELECT"
                " gen_random_uuid(), 'sleep', '{}', 3, now() - interval '1 second'"
                " FROM generate_series(1, 100)"
            )
        )
        await conn.execute(sa.text("ANALYZE jobqueue.jobs"))
    for statement, params in (
        (
            queries.JOB_CLAIM,
            {"queues": ["default"], "slots": [10], "lease_seconds": 60.0, **NO_FLOORS},
        ),
        (queries.JOB_NEXT_DUE, {"queues": ["default"], **NO_FLOORS}),
    ):
        async with engine.connect() as conn:
            raw = await driver(conn)
            sql = Compiled(statement)
            rows = await raw.fetch(
                f"EXPLAIN (ANALYZE, FORMAT JSON) {sql.sql}",
                *sql.args(
                    {
                        "claim": new_id(),
                        "holder": "plan-host:1",
                        "key_limits": [],
                        **NO_OVERRUNS,
                        **NO_TURNS,
                        **params,
                    }
                ),
            )
            await conn.rollback()
        plan = rows[0][0]
        root = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
        assert _rows_read(root) < 1000, json.dumps(root, indent=1)


def _rows_read(node: dict) -> int:
    """Index and table rows read by every scan of the plan, over all its loops."""
    own = 0
    if "Scan" in node.get("Node Type", ""):
        loops = node.get("Actual Loops", 1)
        own = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * loops
    return own + sum(_rows_read(child) for child in node.get("Plans", []))


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_recovery_reads_the_partial_lease_index(engine, generic):
    await _fill(engine)
    plan = await _plan(engine, queries.JOB_RECOVER_EXPIRED, {"window": None}, generic)
    assert "jobs_lease_idx" in _index_scans(plan), plan
    assert '"Seq Scan"' not in plan, plan


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_releasing_a_lost_claim_reads_only_leased_rows(engine, generic):
    await _fill(engine)
    plan = await _plan(engine, queries.JOB_RELEASE_CLAIM, {"claim_ids": [new_id()]}, generic)
    assert "jobs_lease_idx" in _index_scans(plan), plan
    assert '"Seq Scan"' not in plan, plan


async def test_submit_with_a_key_uses_the_idempotency_index(engine):
    await _fill(engine)
    async with engine.begin() as conn:
        await store.submit(conn, NewJob(new_id(), "sleep", {}, 1, "k"))
        _, created = await store.submit(conn, NewJob(new_id(), "sleep", {}, 1, "k"))
    assert created is False
    plan = await _plan(
        engine,
        sa.select(jobs.c.id).where(jobs.c.idempotency_key == sa.bindparam("k")),
        {"k": "k"},
        True,
    )
    assert "jobs_idempotency_key_idx" in _index_scans(plan), plan


# --- per-type limits (TYPE_CONCURRENCY, TYPE_RATE) ---------------------------------------


def _scanned_tables(plan: str) -> set[str]:
    """Tables read by a sequential scan."""
    return {n.get("Relation Name") for n in _nodes(plan) if n.get("Node Type") == "Seq Scan"}


@FLOORS
@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_a_claim_that_skips_limited_types_reads_the_claim_index(engine, generic, floors):
    await _fill(engine)
    params = {
        "queues": ["default", "other"],
        "slots": [10, 5],
        "lease_seconds": 60.0,
        "claim": new_id(),
        "holder": "plan-host:1",
        "key_limits": [],
        **NO_OVERRUNS,
        **NO_TURNS,
        "limited": ["webhook"],
        **floors,
    }
    statements = (
        (
            queries.JOB_CLAIM_UNLIMITED_KEY_FLOORS,
            queries.JOB_COMPLETE_AND_CLAIM_UNLIMITED_KEY_FLOORS,
        )
        if floors is FLOORED
        else (queries.JOB_CLAIM_UNLIMITED, queries.JOB_COMPLETE_AND_CLAIM_UNLIMITED)
    )
    for statement in statements:
        values = {**params, "ids": [new_id()], "tokens": [1], "results": [None]}
        plan = await _plan(engine, statement, values, generic)
        assert "jobs_claim_key_idx" in _index_scans(plan), plan
        assert "jobs" not in _scanned_tables(plan), plan


def _type_floors(types: list[str], floored: bool) -> dict:
    """The limited claim's floor parameters: from the head, or from floors it learnt."""
    floors = TypeFloors(types)
    if floored:
        now = datetime.now(UTC)
        taken = [SimpleNamespace(type=t, queue="default", priority=0, run_at=now) for t in types]
        floors.learn(taken, {t: micros(now) for t in types}, sweep=True)
    return floors.params(["default", "other"], sweep=not floored)


@pytest.mark.parametrize("floored", [False, True], ids=["from-the-head", "from-floors"])
@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_a_limited_claim_reads_the_type_index_and_only_leased_rows(engine, generic, floored):
    await _fill(engine)
    plan = await _plan(
        engine,
        queries.JOB_CLAIM_LIMITED,
        {
            "queues": ["default", "other"],
            "slots": [10, 5],
            "types": ["sleep", "mail"],
            "concurrency": [3, None],
            "overruns": [0, 0],
            **NO_FLOORS,
            **_type_floors(["sleep", "mail"], floored),
            "rates": [None, 50],
            "periods": [None, 1.0],
            "lease_seconds": 60.0,
            "claim": new_id(),
            "holder": "plan-host:1",
            "key_limits": [],
            **NO_OVERRUNS,
            **NO_TURNS,
        },
        generic,
    )
    assert {"jobs_claim_type_idx", "jobs_lease_idx"} <= _index_scans(plan), plan
    assert "jobs" not in _scanned_tables(plan), plan


async def test_a_limited_claim_reads_no_more_of_other_types_than_it_has_slots(engine):
    """20,000 pending jobs of an unlimited type ahead in the claim order cost a limited
    claim only the few it ranks against its own type's jobs (at most its free slots)."""
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO jobqueue.jobs (id, type, payload, max_attempts, priority, run_at)"
                " SELECT gen_random_uuid(), 'bulk', '{}', 3, 50,"
                " now() - interval '1 minute' FROM generate_series(1, 20000)"
            )
        )
        await conn.execute(
            sa.text(
                "INSERT INTO jobqueue.jobs (id, type, payload, max_attempts, run_at) SELECT"
                " gen_random_uuid(), 'mail', '{}', 3, now() - interval '1 second'"
                " FROM generate_series(1, 100)"
            )
        )
        await conn.execute(sa.text("ANALYZE jobqueue.jobs"))
    params = {
        "queues": ["default"],
        "slots": [10],
        "types": ["mail"],
        "concurrency": [5],
        "overruns": [0],
        **NO_FLOORS,
        **_type_floors(["mail"], False),
        "rates": [None],
        "periods": [None],
        "lease_seconds": 60.0,
        "claim": new_id(),
        "holder": "plan-host:1",
        "key_limits": [],
        **NO_OVERRUNS,
        **NO_TURNS,
    }
    async with engine.connect() as conn:
        raw = await driver(conn)
        sql = Compiled(queries.JOB_CLAIM_LIMITED)
        rows = await raw.fetch(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql.sql}", *sql.args(params))
        await conn.rollback()
    plan = rows[0][0]
    root = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    assert _rows_read(root) < 1000, json.dumps(root, indent=1)
