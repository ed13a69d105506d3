"""A database outage between the worker and PostgreSQL (a TCP fault proxy): the processes
keep running, log the outage once, and finish every job by themselves once it ends."""

from __future__ import annotations

import asyncio
import collections

import pytest

from tests.faultproxy import FaultProxy
from tests.worker.support import all_in, eventually, fetch, read_log, start_worker, submit, until

pytestmark = pytest.mark.e2e


def _per_process(worker, msg: str) -> collections.Counter[int]:
    return collections.Counter(
        line["worker_process"] for line in worker.messages(msg) if "worker_process" in line
    )


async def test_database_outage_neither_crashes_the_worker_nor_loses_a_job(
    database_url, engine, tmp_path
):
    with FaultProxy.to_database(database_url) as proxy:
        worker = start_worker(
            proxy.database_url(database_url), tmp_path, WORKER_PROCESSES="2", WORKERS="2"
        )
        try:
            await until(lambda: len(worker.child_pids()) == 2, 90, "two worker processes")
            before = await submit(engine, "test.record", count=4)
            await eventually(lambda: all_in(engine, before, "completed"), 60, "jobs before")

            # Jobs running when the database goes away must still be recorded afterwards.
            in_flight = await submit(engine, "test.record", {"seconds": 3}, count=2)
            await until(
                lambda: (
                    len([r for r in read_log(worker.exec_log) if r[1] in map(str, in_flight)]) == 2
                ),
                60,
                "the in-flight jobs running",
            )
            proxy.refuse()
            proxy.cut()
            during = await submit(engine, "test.record", count=6)
            await until(
                lambda: _per_process(worker, "database unavailable") == {0: 1, 1: 1},
                30,
                "each process to notice the outage",
            )
            await until(lambda: worker.status_of("/readyz") == 503, 30, "/readyz 503")
            assert worker.status_of("/healthz") == 200

            # The outage goes on for a while, refused and then silently dropping packets.
            await asyncio.sleep(3)
            proxy.blackhole()
            await asyncio.sleep(3)
            assert _per_process(worker, "database unavailable") == {0: 1, 1: 1}  # not per poll
            assert not worker.messages("worker process died, restarting")
            assert worker.status_of("/healthz") == 200

            proxy.pass_through()
            everything = before + in_flight + during
            await eventually(lambda: all_in(engine, everything, "completed"), 90, "all jobs")
            # A process that ran none of the remaining jobs notices at its next claim.
            await until(
                lambda: _per_process(worker, "database available again") == {0: 1, 1: 1},
                30,
                "each process to notice the database is back",
            )
            assert all(j.attempts == 1 for j in (await fetch(engine, everything)).values())
            assert not worker.messages("worker process died, restarting")
            assert len(worker.child_pids()) == 2
            await until(lambda: worker.status_of("/readyz") == 200, 30, "/readyz 200 again")
        finally:
            assert worker.stop(60) == 0
