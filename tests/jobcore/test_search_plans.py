"""The list, the queue depths and retention read the indexes built for them, on a table of
realistic size with fresh statistics, in custom and generic plans.

The table is `bench.listing`'s mix (mostly completed jobs, some failed, dead-lettered and
cancelled, pending and running jobs among the newest), filled once for this module.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import asyncpg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.listing import FILL
from jobcore import compiled, history, maintenance, queries, search
from jobcore.db import make_engine
from jobcore.floors import CountFloors
from jobcore.runner import Compiled
from jobcore.schema import LIST_INDEXES, jobs
from jobcore.search import Filters
from jobcore.states import FINISHED, Status
from tests import pg
from tests.jobcore.test_query_plans import _nodes, _plan
from tests.jobcore.test_states import C, D, F, P, R, X
from tests.pg import driver

# One worker fills the table once and runs every test of the module (make test runs
# with --dist loadgroup).
pytestmark = pytest.mark.xdist_group("search_plans")

ROWS = 200_000
LIMIT = 50
TYPE, QUEUE = "report", "critical"
LIST = {f"jobs_{name}_idx" for name in LIST_INDEXES}


@pytest.fixture(scope="module")
def big_database(pg_server: str, pg_template: str) -> Iterator[tuple[str, str]]:
    """A migrated database holding ROWS jobs, analysed; and the id in the middle of them."""
    name = pg.create_database(pg_server, pg_template)
    url = pg.with_database(pg_server, name)

    async def fill() -> str:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(FILL, ROWS, timeout=600)
            middle = await conn.fetchval(
                "SELECT id FROM jobqueue.jobs ORDER BY id OFFSET $1 LIMIT 1", ROWS // 2
            )
            await _fill_history(conn)
            await conn.execute("VACUUM ANALYZE jobqueue.jobs", timeout=600)
            await conn.execute("ANALYZE jobqueue.jobs_history", timeout=600)
        finally:
            await conn.close()
        return str(middle)

    try:
        yield url, asyncio.run(fill())
    finally:
        pg.drop_database(pg_server, name)


async def _fill_history(conn: asyncpg.Connection) -> None:
    """`jobs_history` in daily leaves, holding about as many completed jobs again as `jobs`
    (copies under ids of their own: the same times, types, queues), as a deployment whose
    completed jobs have moved has them. Not those of the first of the days FILL's jobs
    finished in: they fill that day's leaf only from the time of day the fill ran, and a
    leaf of a few minutes' jobs (the fill run near midnight) is one the planner reads whole
    and rightly so, which the plan tests would take for a missing index."""
    now = await conn.fetchval("SELECT now()")
    first = None
    for days in range(9, -1, -1):  # the days FILL's jobs finished in, but the first
        leaves = await compiled.history_leaves(conn)
        leaf = history.leaf_at(now - timedelta(days=days), history.DAY, leaves)
        first = first or leaf
        if leaf not in leaves:
            assert await compiled.history_add_leaf(conn, leaf)
    assert first is not None
    columns = [column.name for column in jobs.c if column.name != "id"]
    named = ", ".join(columns)
    await conn.execute(
        f"""INSERT INTO jobqueue.jobs_history (id, {named})
            SELECT encode(overlay(uuid_send(id) PLACING substring(uuid_send(gen_random_uuid())
                                                        FROM 9) FROM 9), 'hex')::uuid, {named}
            FROM jobqueue.jobs WHERE status = 'completed' AND finished_at >= $1""",
        first.lower,
        timeout=600,
    )


@pytest.fixture
async def big(big_database: tuple[str, str]) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(big_database[0], pool_size=2)
    try:
        yield engine
    finally:
        await engine.dispose()


def _reads(plan: str) -> list[tuple[str, set[str]]]:
    """Each read of the jobs table: its node type and the indexes it goes through."""
    out = []
    for node in _nodes(plan):
        kind = node.get("Node Type")
        if kind in ("Index Scan", "Index Only Scan"):
            out.append((kind, {node["Index Name"]}))
        elif kind == "Bitmap Heap Scan":
            out.append((kind, {n["Index Name"] for n in _nodes(json.dumps(node["Plans"]))}))
        elif kind == "Seq Scan":
            out.append((kind, set()))
    return out


COMBOS = {
    "none": Filters(),
    **{f"status={s}": Filters(statuses=[s]) for s in Status},
    "status=pending,failed,dead_letter": Filters(statuses=[P, F, D]),
    "status=all-six": Filters(statuses=list(Status)),
    "type": Filters(type=TYPE),
    "queue": Filters(queue=QUEUE),
    "type+queue": Filters(type=TYPE, queue=QUEUE),
    "status=completed+type": Filters(statuses=[C], type=TYPE),
    "status=failed+queue": Filters(statuses=[F], queue=QUEUE),
    "status=processing+queue": Filters(statuses=[R], queue=QUEUE),
    "status=completed+type+queue": Filters(statuses=[C], type=TYPE, queue=QUEUE),
    "status=failed,cancelled+type+queue": Filters(statuses=[F, X], type=TYPE, queue=QUEUE),
}


def _leading(filters: Filters) -> set[str]:
    """The list indexes that lead with the filters given."""
    if filters.type is not None and filters.queue is not None:
        return {"jobs_type_idx", "jobs_queue_idx"}
    if filters.type is not None:
        return {"jobs_type_idx"}
    if filters.queue is not None:
        return {"jobs_queue_idx"}
    return {"jobs_status_idx"}


# A leaf's indexes are named after the leaf and the columns (`<leaf>_type_id_idx`): the
# parent's index each stands for, by the name's end.
_HISTORY = {
    "_id_idx": "jobs_history_id_idx",
    "_type_id_idx": "jobs_history_type_idx",
    "_queue_id_idx": "jobs_history_queue_idx",
    "_finished_at_idx": "jobs_history_finished_idx",
}


def _parent_index(name: str) -> str:
    if not name.startswith(history.PREFIX) or name in _HISTORY.values():
        return name
    return next(
        _HISTORY[end] for end in sorted(_HISTORY, key=len, reverse=True) if name.endswith(end)
    )


def _history_leading(filters: Filters) -> set[str]:
    """The history's indexes that lead with the filters given."""
    if filters.type is not None and filters.queue is not None:
        return {"jobs_history_type_idx", "jobs_history_queue_idx"}
    if filters.type is not None:
        return {"jobs_history_type_idx"}
    if filters.queue is not None:
        return {"jobs_history_queue_idx"}
    return {"jobs_history_id_idx"}


def _values(filters: Filters, before: str | None) -> dict:
    return {"limit": LIMIT + 1, "type": filters.type, "queue": filters.queue, "before": before}


@pytest.mark.parametrize("autocommit", [False, True], ids=["in-a-transaction", "autocommit"])
async def test_a_list_is_always_planned_with_its_values(big, autocommit, monkeypatch):
    """A generic plan guesses a type's share of a status: the list runs with custom plans
    (the plan test below checks those), also on a connection that commits each statement on
    its own, as the API's does. (The list's statement is swapped for one that reports the
    setting it runs under.)"""
    reports = sa.text("SELECT current_setting('plan_cache_mode') AS mode")
    monkeypatch.setattr(search, "list_statement", lambda filters, after: reports)
    monkeypatch.setattr(search, "job_from_row", lambda row: row["mode"])
    engine = big.execution_options(isolation_level="AUTOCOMMIT") if autocommit else big
    async with engine.connect() as conn:
        found, _ = await search.list_jobs(conn, Filters(type=TYPE), LIMIT, None)
    assert found == ["force_custom_plan"]


@pytest.mark.parametrize("page", ["first", "cursor"])
@pytest.mark.parametrize("filters", COMBOS.values(), ids=COMBOS.keys())
async def test_every_list_filter_reads_its_list_index_never_the_whole_table(
    big, big_database, filters, page
):
    before = big_database[1] if page == "cursor" else None
    statement = search.list_statement(filters, after=before is not None)
    plan = await _plan(big, statement, _values(filters, before), generic=False)
    reads = [(kind, {_parent_index(i) for i in indexes}) for kind, indexes in _reads(plan)]
    assert "Seq Scan" not in {kind for kind, _ in reads}, plan
    # Completed jobs moved to the history: one read per leaf, through its index that leads
    # with the filters given.
    moved = [indexes for _, indexes in reads if any(i.startswith("jobs_history") for i in indexes)]
    statuses = set(filters.statuses or Status)
    assert len(moved) == (len(await _leaves(big)) if C in statuses else 0), plan
    assert all(indexes <= _history_leading(filters) for indexes in moved), plan
    reads = [read for read in reads if read[1] not in moved]
    if filters == Filters():
        assert reads == [("Index Scan", {"jobs_pkey"})], plan
        return
    running = [indexes for _, indexes in reads if "jobs_lease_idx" in indexes]
    others = [indexes for _, indexes in reads if "jobs_lease_idx" not in indexes]
    # Running jobs through the lease index (they are few); every other status requested
    # through a list index that leads with the filters given: one read per status.
    assert running == ([{"jobs_lease_idx"}] if R in statuses else []), plan
    assert len(others) == len(statuses - {R}), plan
    assert all(indexes <= _leading(filters) for indexes in others), plan


async def _leaves(engine: AsyncEngine) -> list[history.Leaf]:
    async with engine.connect() as conn:
        return await compiled.history_leaves(await driver(conn))


@pytest.mark.parametrize(
    "filters",
    [f for f in COMBOS.values() if f.type is None or f.queue is None],
    ids=[k for k, f in COMBOS.items() if f.type is None or f.queue is None],
)
async def test_a_page_not_filtered_by_both_type_and_queue_reads_one_page_per_status(
    big, big_database, filters
):
    """At most `limit` + 1 entries of each status asked for (and the running jobs, read
    through the lease index), however large the table: a deep page costs a first page."""
    async with big.connect() as conn:
        running = await conn.scalar(
            sa.text("SELECT count(*) FROM jobqueue.jobs WHERE status = 'processing'")
        )
    branches = len(set(filters.statuses or Status) - {R}) if filters != Filters() else 1
    # The history's leaves, merged: each gives its first entry, and the page at most
    # `limit` + 1 in all.
    moved = LIMIT + 1 + len(await _leaves(big)) if C in set(filters.statuses or Status) else 0
    for before in (None, big_database[1]):
        statement = search.list_statement(filters, after=before is not None)
        root = await _analyze(big, statement, _values(filters, before))
        assert _jobs_rows_read(root) <= branches * (LIMIT + 1) + running, json.dumps(root)
        assert _jobs_rows_read(root, history.PREFIX) <= moved, json.dumps(root)


async def _analyze(engine: AsyncEngine, statement, values: dict) -> dict:
    compiled = Compiled(statement)
    async with engine.connect() as conn:
        raw = await driver(conn)
        plan = await raw.fetchval(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {compiled.sql}", *compiled.args(values)
        )
        await conn.rollback()
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]


def _jobs_rows_read(node: dict, table: str = "jobs") -> int:
    """Rows the plan's reads of the jobs table (or of the history's leaves, by the prefix
    of their names) returned or filtered out, over every loop."""
    own = 0
    name = node.get("Relation Name", "")
    if name == table or (table == history.PREFIX and name.startswith(table)):
        loops = node.get("Actual Loops", 1)
        removed = node.get("Rows Removed by Filter", 0) + node.get(
            "Rows Removed by Index Recheck", 0
        )
        own = (node.get("Actual Rows", 0) + removed) * loops
    return own + sum(_jobs_rows_read(child, table) for child in node.get("Plans", []))


# --- queue depths and retention --------------------------------------------------------------


@pytest.mark.parametrize("floored", [False, True], ids=["from-the-head", "from-floors"])
@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_queue_depths_read_indexes_only(big, generic, floored):
    floors = CountFloors()
    if floored:  # the gauges' reads between sweeps
        async with big.connect() as conn:
            await compiled.queue_depths(await driver(conn), floors, sweep=True)
    plan = await _plan(big, search.QUEUE_GET_DEPTHS, floors.params(sweep=not floored), generic)
    reads = _reads(plan)
    assert "Seq Scan" not in {kind for kind, _ in reads}, plan
    used = {_parent_index(i) for _, indexes in reads for i in indexes}
    assert used <= {
        "jobs_queue_idx",
        "jobs_claim_queue_idx",
        "jobs_claim_key_idx",
        "jobs_lease_idx",
        "jobs_history_queue_idx",  # the queues found among the moved jobs, one probe each
    }, plan


async def test_queue_depths_read_no_finished_job(big):
    """Pending, running and dead-lettered rows, and one index entry per queue to find the
    queues: none of the finished jobs that fill most of the table."""
    async with big.connect() as conn:
        counts = dict(
            (
                await conn.execute(
                    sa.text("SELECT status, count(*) FROM jobqueue.jobs GROUP BY status")
                )
            ).all()
        )
        queues = await conn.scalar(sa.text("SELECT count(DISTINCT queue) FROM jobqueue.jobs"))
        moved = await conn.scalar(sa.text("SELECT count(*) FROM jobqueue.jobs_history"))
    counted = counts.get("pending", 0) + counts.get("processing", 0) + counts.get("dead_letter", 0)
    # The finished jobs are there to be skipped, in both tables.
    assert sum(counts.values()) > 10 * counted and moved > 10 * counted
    root = await _analyze(big, search.QUEUE_GET_DEPTHS, search.FROM_THE_HEAD)
    assert _jobs_rows_read(root) <= counted + 2 * queues + 2, json.dumps(root)
    # In the history, a probe per queue (and one past the last) in each leaf.
    leaves = len(await _leaves(big))
    assert _jobs_rows_read(root, history.PREFIX) <= (queues + 1) * leaves, json.dumps(root)


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_the_history_prune_reads_the_finished_index_of_the_leaves_it_may_delete_from(
    big, generic
):
    """Leaves that end before the cutoff are dropped whole; the prune reads by `finished_at`
    and, with the cutoff known at execution, only the leaves it falls in or after."""
    values = {"age": 3 * 86400.0, "batch": maintenance.PRUNE_BATCH}
    plan = await _plan(big, history.HISTORY_PRUNE, values, generic)
    reads = _reads(plan)
    assert reads and "Seq Scan" not in {kind for kind, _ in reads}, plan
    assert {_parent_index(i) for _, indexes in reads for i in indexes} <= {
        "jobs_history_finished_idx",
        "jobs_history_id_idx",
    }, plan


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
@pytest.mark.parametrize("status", sorted(FINISHED))
async def test_each_prune_selects_through_the_status_index(big, status, generic):
    plan = await _plan(big, maintenance.JOB_PRUNE[status], {"age": 86400.0}, generic)
    reads = _reads(plan)
    assert "Seq Scan" not in {kind for kind, _ in reads}, plan
    # The batch is chosen in the status index's (status, id) range below the id bound; the
    # delete then finds its rows by primary key.
    selecting = [
        n for n in _nodes(plan) if "status" in n.get("Index Cond", "") + n.get("Filter", "")
    ]
    assert selecting and all(n.get("Index Name") == "jobs_status_idx" for n in selecting), plan


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_a_record_is_read_by_id_in_both_tables(big, big_database, generic):
    plan = await _plan(big, queries.JOB_GET, {"id": big_database[1]}, generic)
    reads = _reads(plan)
    assert "Seq Scan" not in {kind for kind, _ in reads}, plan
    used = [_parent_index(i) for _, indexes in reads for i in indexes]
    assert sorted(set(used)) == ["jobs_history_id_idx", "jobs_pkey"], plan
    assert used.count("jobs_history_id_idx") == len(await _leaves(big)), plan


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_the_oldest_movable_job_is_read_from_where_the_move_starts(big, generic):
    """The probe before a move enters `jobs_movable_idx` at its `since` (under a held
    horizon what lies before it is dead), never the index of every finished job."""
    async with big.connect() as conn:
        now = await conn.scalar(sa.text("SELECT now()"))
    plan = await _plan(
        big, history.HISTORY_GET_OLDEST, {"since": now - timedelta(hours=1)}, generic
    )
    assert "Seq Scan" not in {kind for kind, _ in _reads(plan)}, plan
    selecting = [n for n in _nodes(plan) if "finished_at" in n.get("Index Cond", "")]
    assert selecting and all(n["Index Name"] == "jobs_movable_idx" for n in selecting), plan
    assert all("finished_at >=" in n["Index Cond"] for n in selecting), plan


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
async def test_the_move_selects_through_the_index_of_movable_jobs(big, generic):
    """Completed jobs without a key, oldest first: however many failed, keyed or pending
    jobs `jobs` holds, the move reads none of them."""
    async with big.connect() as conn:
        now = await conn.scalar(sa.text("SELECT now()"))
    values = {"since": now - timedelta(days=3), "until": now, "batch": maintenance.PRUNE_BATCH}
    plan = await _plan(big, history.HISTORY_MOVE, values, generic)
    reads = _reads(plan)
    assert "Seq Scan" not in {kind for kind, _ in reads}, plan
    selecting = [n for n in _nodes(plan) if "finished_at" in n.get("Index Cond", "")]
    assert selecting and all(n["Index Name"] == "jobs_movable_idx" for n in selecting), plan
