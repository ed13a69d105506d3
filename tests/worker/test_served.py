"""The record of what a worker process serves (`jobqueue_worker.served`): every type it has
a handler for, with the handler's options and the process's schedules of it, written to
`job_types` through the worker's own call and refreshed; and periodic jobs created with the
handler's options as defaults."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa

import tests.worker.handlers_options  # noqa: F401 (registers test.options.receipt)
from jobcore.periodic import schedules
from jobcore.schema import job_types
from jobqueue_worker.database import PgJobStore
from jobqueue_worker.periodic import Scheduler
from jobqueue_worker.served import INTERVAL, TypeRecord


async def _rows(engine):
    async with engine.connect() as conn:
        result = await conn.execute(sa.select(job_types).order_by(job_types.c.type))
        return {row["type"]: row for row in result.mappings()}


async def test_a_worker_records_its_types_with_options_and_schedules_and_refreshes(engine):
    assert INTERVAL <= 60
    store = PgJobStore(engine)
    try:
        loop = TypeRecord(store, schedules())
        recorded = await loop.run_once()
        rows = await _rows(engine)
        assert {"sleep", "webhook", "test.options.receipt"} <= set(rows) == set(recorded)
        receipt = rows["test.options.receipt"]
        assert receipt["options"] == {
            "queue": "mail",
            "priority": 5,
            "max_attempts": 3,
            "timeout": 60.0,
        }
        assert {"name": "receipt-yearly", "cron": "0 0 1 1 *", "payload": {"yearly": True}} in (
            receipt["schedules"]
        )
        assert rows["sleep"]["options"] == {} and ":" in receipt["recorded_by"]
        first = receipt["recorded_at"]
        await loop.run_once()
        assert (await _rows(engine))["test.options.receipt"]["recorded_at"] > first
    finally:
        await store.close()


def test_a_periodic_job_takes_the_handlers_options_for_what_its_schedule_omits():
    (schedule,) = [s for s in schedules() if s.name == "receipt-yearly"]
    scheduler = Scheduler(None, [schedule], max_attempts=5)  # type: ignore[arg-type]
    new = scheduler.new_job(schedule, datetime(2027, 1, 1, tzinfo=UTC))
    assert (new.queue, new.priority, new.max_attempts, new.timeout) == ("mail", 5, 3, 60.0)
