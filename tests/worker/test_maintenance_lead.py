"""Leading a maintenance task on the real PostgreSQL: one leader at a time, replaced when its
lease runs out or when it resigns; and the queue gauges, set by the leader only."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from jobcore import compiled
from jobcore.ids import new_id
from jobcore.maintenance import GAUGES, RETENTION
from jobcore.rows import NewJob
from jobcore.schema import jobs, maintenance_leases
from jobcore.search import DEPTH_STATUSES
from jobcore.states import Operation
from jobqueue_worker import maintenance, metrics
from jobqueue_worker.database import PgJobStore
from jobqueue_worker.maintenance import Lead, QueueGauges, TakingTurns
from tests.pg import driver
from tests.worker.support import eventually, submit_jobs


@pytest.fixture(autouse=True)
def _no_gauges_shown():
    # The gauges belong to the process: no test sees another's.
    metrics.hide_queue_depths()
    yield
    metrics.hide_queue_depths()


async def test_of_two_contenders_one_leads_and_the_other_takes_over_when_the_lease_runs_out(pg):
    first, second = Lead(pg, GAUGES, 1.0), Lead(pg, GAUGES, 1.0)
    assert await first.take() and first.held
    assert not await second.take() and not second.held
    assert await first.take()  # renewing
    assert not await second.take()

    # The first stops renewing: its lease runs out by the database's clock, then by its own.
    await eventually(second.take, 10, "the lease to run out", interval=0.05)
    assert second.held
    assert not await first.take() and not first.held


async def test_a_leader_that_resigns_is_replaced_at_once(pg, caplog):
    first, second = Lead(pg, GAUGES, 3600), Lead(pg, GAUGES, 3600)
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        assert await first.take()
        assert not await second.take()
        await first.resign()
        assert not first.held
        assert await second.take()
    said = [(r.getMessage(), r.holder) for r in caplog.records]  # type: ignore[attr-defined]
    assert said == [
        ("maintenance lead taken", str(first.holder)),
        ("maintenance lead given up", str(first.holder)),
        ("maintenance lead taken", str(second.holder)),
    ]


async def test_each_task_has_a_leader_of_its_own(pg, engine):
    gauges, retention = Lead(pg, GAUGES, 60), Lead(pg, RETENTION, 60)
    assert await gauges.take() and await retention.take()
    assert not await Lead(pg, GAUGES, 60).take()
    assert not await Lead(pg, RETENTION, 60).take()
    async with engine.connect() as conn:
        rows = await conn.execute(sa.select(maintenance_leases.c.task, maintenance_leases.c.holder))
        assert dict(rows.all()) == {GAUGES: gauges.holder, RETENTION: retention.holder}


async def test_a_leader_stops_believing_it_leads_once_its_lease_may_have_run_out(pg):
    lead = Lead(pg, GAUGES, 0.3)
    assert await lead.take()
    await eventually(lambda: _not(lead.held), 5, "the local lease to end", interval=0.02)


async def test_a_take_that_fails_leaves_the_lead_to_run_out_and_resign_still_frees_it(pg, caplog):
    class Flaky:
        down = False

        async def take_lead(self, *args):
            if self.down:
                raise ConnectionError("refused")
            return await pg.take_lead(*args)

        async def resign(self, *args):
            return await pg.resign(*args)

    flaky = Flaky()
    lead = Lead(flaky, GAUGES, 0.5)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        assert await lead.take()
        flaky.down = True
        with pytest.raises(ConnectionError):
            await lead.take()
        assert lead.held  # the lease it has is still good
        await eventually(lambda: _not(lead.held), 5, "the local lease to end", interval=0.02)
        with pytest.raises(ConnectionError):
            await lead.take()
    lost = [r for r in caplog.records if r.getMessage() == "maintenance lead lost"]
    assert [r.reason for r in lost] == ["lease ran out"]  # type: ignore[attr-defined]
    # It may still be ours in the database (its lease ran out there too, or not yet):
    # resigning removes it either way.
    await lead.resign()
    assert await Lead(pg, GAUGES, 60).take()


async def _not(value: bool) -> bool:
    return not value


def _gauges() -> dict[tuple[str, ...], float]:
    """Every queue-gauge series this process exports."""
    found = {}
    for family in REGISTRY.collect():
        if family.name in ("jobs_queued", "jobs_oldest_pending_age_seconds"):
            for s in family.samples:
                found[(s.name, *(s.labels[k] for k in sorted(s.labels)))] = s.value
    return found


async def test_the_gauges_leader_exports_each_queue_depth_and_no_other_process_does(pg, engine):
    (running,) = await submit_jobs(engine, [NewJob(new_id(), "sleep", {}, 3, queue="alpha")])
    async with engine.begin() as conn:
        (claimed,) = await compiled.claim(await driver(conn), {"alpha": 1}, 3600)
    assert claimed.id == running.id
    (dead,) = await submit_jobs(engine, [NewJob(new_id(), "sleep", {}, 1, queue="alpha")])
    async with engine.begin() as conn:
        raw = await driver(conn)
        (taken,) = await compiled.claim(raw, {"alpha": 1}, 3600)
        assert taken.id == dead.id
        assert await compiled.record(raw, Operation.DEAD_LETTER, [taken.lease], ["x"]) == []
    due = await submit_jobs(
        engine,
        [NewJob(new_id(), "sleep", {}, 3, queue="alpha") for _ in range(3)]
        + [NewJob(new_id(), "sleep", {}, 3, queue="alpha", delay=3600) for _ in range(2)]
        + [NewJob(new_id(), "sleep", {}, 3, queue="beta")],
    )
    async with engine.begin() as conn:
        # The oldest due job of alpha became due 100 s ago.
        await conn.execute(
            sa.update(jobs)
            .where(jobs.c.id == due[0].id)
            .values(run_at=sa.func.now() - sa.text("interval '100 seconds'"))
        )

    other = Lead(pg, GAUGES, 3600)
    assert await other.take()
    gauges = QueueGauges(TakingTurns(pg), interval=0.5, lease=5)
    assert await gauges.run_once() is None
    assert _gauges() == {}  # another process leads: nothing of ours

    await other.resign()
    depths = await gauges.run_once()
    assert depths is not None
    found = _gauges()
    age = found.pop(("jobs_oldest_pending_age_seconds", "alpha"))
    assert 100 <= age < 160
    assert found == {
        ("jobs_oldest_pending_age_seconds", "beta"): pytest.approx(0.0, abs=60),
        **{
            ("jobs_queued", "alpha", s): n
            for s, n in zip(DEPTH_STATUSES, (3, 2, 1, 1), strict=True)
        },
        **{
            ("jobs_queued", "beta", s): n for s, n in zip(DEPTH_STATUSES, (1, 0, 0, 0), strict=True)
        },
    }

    # A queue that no longer holds jobs is no longer reported, from the next sweep on
    # (between sweeps the gauges read from their floors, `jobcore.floors.CountFloors`,
    # and report the queues they know: every round while sweeps are cheap).
    async with engine.begin() as conn:
        await conn.execute(sa.delete(jobs).where(jobs.c.queue == "beta"))
    deadline = time.monotonic() + 5
    while not gauges.floors.sweeps.due(time.monotonic()):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    await gauges.run_once()
    assert {key[1] for key in _gauges()} == {"alpha"}

    # Stopping: the loop hides what it exported and resigns.
    stop = asyncio.Event()
    stop.set()
    await gauges.run(stop)
    assert _gauges() == {}
    assert await Lead(pg, GAUGES, 60).take()


async def test_a_gauges_leader_that_loses_its_lead_stops_exporting(pg):
    gauges = QueueGauges(TakingTurns(pg), interval=0.1, lease=0.3)
    await submit_jobs_default(pg)
    assert await gauges.run_once() is not None and _gauges()
    # It stops renewing; another process takes the lead once the lease has run out.
    usurper = Lead(pg, GAUGES, 3600)
    await eventually(usurper.take, 10, "the lease to run out", interval=0.05)
    assert await gauges.run_once() is None
    assert _gauges() == {}
    await gauges.lead.resign()


async def submit_jobs_default(pg: PgJobStore) -> None:
    await submit_jobs(pg.engine, [NewJob(new_id(), "sleep", {}, 3)])


def test_a_lease_must_outlast_a_round():
    with pytest.raises(ValueError, match="outlast"):
        QueueGauges(None, interval=2, lease=2)  # type: ignore[arg-type]


async def test_a_resignation_the_database_does_not_answer_never_holds_up_shutdown(
    pg, caplog, monkeypatch
):
    class Silent:
        async def take_lead(self, *args):
            return await pg.take_lead(*args)

        async def resign(self, *args):
            await asyncio.Event().wait()  # a database that never answers

    monkeypatch.setattr(maintenance, "RESIGN_TIMEOUT", 0.2)
    lead = Lead(Silent(), GAUGES, 60)  # type: ignore[arg-type]
    assert await lead.take()
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        await asyncio.wait_for(lead.resign(), 5)
    assert not lead.held
    (line,) = [r for r in caplog.records if r.getMessage() == "maintenance lead given up"]
    assert line.resigned is False  # type: ignore[attr-defined]
