"""`jobs_retention_last_run_timestamp_seconds`: set when a retention run has gone through every
status it prunes, and only then; absent from the supervisor's /metrics until a run has."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy as sa
from prometheus_client import REGISTRY, multiprocess

from jobcore.maintenance import PRUNE_BATCH, RETENTION
from jobcore.schema import maintenance_leases
from jobcore.states import Status
from jobqueue_worker.maintenance import Lead, Retention, TakingTurns
from tests.worker.test_retention import AGE, Counting, insert, older_than, remaining

NAME = "jobs_retention_last_run_timestamp_seconds"


def last_run() -> float | None:
    return REGISTRY.get_sample_value(NAME)


async def test_a_run_through_every_status_records_when_it_ended(engine, pg):
    await insert(engine, Status.COMPLETED, 3)
    await insert(engine, Status.FAILED, 2)
    await older_than(engine, AGE)
    retention = Retention(TakingTurns(pg), {Status.COMPLETED: AGE, Status.FAILED: AGE})
    before = time.time()
    assert await retention.run_once() == {Status.COMPLETED: 3, Status.FAILED: 2}
    stamp = last_run()
    assert stamp is not None and before <= stamp <= time.time()

    # A run with nothing to delete has still gone through every status.
    await asyncio.sleep(0.01)
    assert await retention.run_once() == {Status.COMPLETED: 0, Status.FAILED: 0}
    again = last_run()
    assert again is not None and again > stamp
    await retention.lead.resign()


async def test_a_process_that_does_not_lead_records_nothing(engine, pg):
    await insert(engine, Status.COMPLETED, 2)
    await older_than(engine, AGE)
    other = Lead(pg, RETENTION, 3600)
    assert await other.take()
    before = last_run()
    retention = Retention(TakingTurns(pg), {Status.COMPLETED: AGE})
    assert await retention.run_once() == {Status.COMPLETED: 0}
    assert last_run() == before
    await other.resign()


async def test_a_run_cut_short_by_a_lost_lead_records_nothing(engine, pg):
    await insert(engine, Status.COMPLETED, PRUNE_BATCH + 10)
    await older_than(engine, AGE)
    counting = Counting(pg)
    retention = Retention(counting, {Status.COMPLETED: AGE}, interval=0.5, lease=1.0)  # type: ignore[arg-type]
    usurper = Lead(pg, RETENTION, 3600)

    async def steal() -> None:
        async with pg.engine.begin() as conn:
            await conn.execute(sa.delete(maintenance_leases))
        assert await usurper.take()

    counting.after_prune = lambda: asyncio.ensure_future(steal())
    before = last_run()
    assert await retention.run_once() == {Status.COMPLETED: PRUNE_BATCH}
    assert len((await remaining(engine))["completed"]) == 10  # the run did end early
    assert last_run() == before
    await usurper.resign()


async def test_a_run_whose_statement_fails_records_nothing(engine, pg):
    await insert(engine, Status.COMPLETED, 2)
    await insert(engine, Status.FAILED, 2)
    await older_than(engine, AGE)

    class FailingOnFailed(Counting):
        async def prune(self, status, age):
            if status == Status.FAILED:
                raise ConnectionError("connection reset")
            return await super().prune(status, age)

    retention = Retention(
        FailingOnFailed(pg),  # type: ignore[arg-type]
        {Status.COMPLETED: AGE, Status.FAILED: AGE},
    )
    before = last_run()
    try:
        await retention.run_once()
    except ConnectionError:
        pass
    else:
        raise AssertionError("the failing statement was not reached")
    assert "completed" not in await remaining(engine)  # the first status was pruned
    assert last_run() == before
    await retention.lead.resign()


# A worker process's side, in prometheus-client's multiprocess mode: "run" records a run; every
# line is answered "ok" once done (the first answer: the metrics are made, as a worker process
# makes them at start).
_CHILD = """
import sys
from jobqueue_worker import metrics
metrics.initialise()
for line in sys.stdin:
    if line.strip() == "run":
        metrics.retention_ran()
    print("ok", flush=True)
"""


def merged(metrics_dir: Path) -> list[float]:
    """The gauge's values as the supervisor's /metrics shows them."""
    collector = multiprocess.MultiProcessCollector(None, path=str(metrics_dir))  # type: ignore[no-untyped-call]
    return [s.value for family in collector.collect() for s in family.samples if s.name == NAME]


def test_the_supervisor_shows_no_time_before_a_run_and_keeps_it_after_the_process_exits(
    tmp_path,
):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin and child.stdout

    def tell(command: str) -> None:
        assert child.stdin and child.stdout
        child.stdin.write(command + "\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "ok"

    try:
        tell("hello")
        assert list(tmp_path.glob("gauge_mostrecent_*.db")), "the child wrote its gauge file"
        assert merged(tmp_path) == []  # written at 0, never set: left out

        before = time.time()
        tell("run")
        (stamp,) = merged(tmp_path)
        assert before <= stamp <= time.time()
    finally:
        child.stdin.close()
        assert child.wait(30) == 0
    # The supervisor forgets an exited child's live gauges; this one is kept.
    multiprocess.mark_process_dead(child.pid, str(tmp_path))  # type: ignore[no-untyped-call]
    assert merged(tmp_path) == [stamp]
