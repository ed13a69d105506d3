"""Vacuum where autovacuum does not (`jobqueue_worker.vacuum`): the leader vacuums a table
of jobqueue's that autovacuum leaves alone once it holds VACUUM_DEAD_TUPLES dead tuples, and
backs off while a held horizon keeps them."""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from jobcore.rows import TableStats
from jobcore.states import Status
from jobqueue_worker.maintenance import TakingTurns
from jobqueue_worker.vacuum import HELD_BACK_FIRST, Vacuum
from tests.worker.support import eventually


async def _dead_in_jobs(pg) -> int:
    return {t.name: t.dead for t in await pg.table_stats()}["jobqueue.jobs"]


async def test_the_leader_vacuums_a_table_autovacuum_leaves_alone(engine, pg, caplog):
    async with engine.begin() as conn:
        # Whatever the server says, autovacuum leaves this table alone now.
        await conn.execute(sa.text("ALTER TABLE jobqueue.jobs SET (autovacuum_enabled = false)"))
        await conn.execute(
            sa.text(
                "INSERT INTO jobqueue.jobs (id, type, payload, max_attempts)"
                " SELECT gen_random_uuid(), 'sleep', '{}', 3 FROM generate_series(1, 6000)"
            )
        )
    async with engine.begin() as conn:
        await conn.execute(sa.text("DELETE FROM jobqueue.jobs"))
    # Statistics reach the shared counts a moment after the transaction.
    await eventually(lambda: _count_at_least(pg, 6000), 30, "6,000 dead tuples counted")
    vacuum = Vacuum(TakingTurns(pg), dead_tuples=5000)
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        assert await vacuum.run_once() == ["jobqueue.jobs"]
    assert await _dead_in_jobs(pg) < 5000
    said = [r.getMessage() for r in caplog.records]
    assert "autovacuum is off for a table: the worker vacuums it" in said
    assert "table vacuumed" in said
    assert await vacuum.run_once() == []  # nothing left to do


async def _count_at_least(pg, n: int) -> bool:
    return await _dead_in_jobs(pg) >= n


class Tables:
    """A maintenance store with scripted table statistics; it always leads."""

    def __init__(self, *tables: TableStats, removes: bool = True) -> None:
        self.tables = {t.name: t for t in tables}
        self.removes = removes
        self.vacuumed: list[str] = []
        self.leads = 0

    async def take_lead(self, task: str, holder: UUID, lease_seconds: float) -> bool:
        self.leads += 1
        return True

    async def resign(self, task: str, holder: UUID) -> None:
        pass

    async def queue_depths(self, floors: Any = None, sweep: bool = True) -> list[Any]:
        return []

    async def prune(self, status: Status, age_seconds: float) -> int:
        return 0

    async def drop_history(self, age_seconds: float) -> int | None:
        return None

    async def table_stats(self) -> list[TableStats]:
        return list(self.tables.values())

    async def vacuum(self, table: str) -> None:
        self.vacuumed.append(table)
        if self.removes:
            self.tables[table] = self.tables[table]._replace(dead=0)


async def test_a_table_autovacuum_vacuums_or_with_few_dead_tuples_is_left_alone():
    store = Tables(
        TableStats("jobs", 900_000, autovacuum=True),
        TableStats("maintenance_leases", 10, autovacuum=False),
    )
    assert await Vacuum(store, dead_tuples=5000).run_once() == []
    assert store.vacuumed == []


async def test_with_vacuum_dead_tuples_0_the_worker_never_vacuums_nor_leads():
    store = Tables(TableStats("jobs", 900_000, autovacuum=False))
    assert await Vacuum(store, dead_tuples=0).run_once() == []
    assert store.vacuumed == [] and store.leads == 0


async def test_a_vacuum_the_horizon_held_back_waits_longer_each_time():
    now = [0.0]
    store = Tables(TableStats("jobs", 50_000, autovacuum=False), removes=False)
    vacuum = Vacuum(store, dead_tuples=5000, clock=lambda: now[0])
    assert await vacuum.run_once() == ["jobs"]  # removed nothing
    now[0] += HELD_BACK_FIRST - 1
    assert await vacuum.run_once() == []
    now[0] += 1
    assert await vacuum.run_once() == ["jobs"]  # again nothing: twice as long now
    now[0] += 2 * HELD_BACK_FIRST - 1
    assert await vacuum.run_once() == []
    now[0] += 1
    store.removes = True  # the horizon moved on
    assert await vacuum.run_once() == ["jobs"]
    store.tables["jobs"] = store.tables["jobs"]._replace(dead=6000)
    assert await vacuum.run_once() == ["jobs"]  # no wait once a vacuum removed them
    assert store.vacuumed == ["jobs"] * 4
