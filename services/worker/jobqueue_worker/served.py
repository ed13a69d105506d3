"""The record of what this worker process serves: at start and every INTERVAL, each type it
has a handler for, with the handler's options and the process's periodic schedules of that
type, goes into `job_types` (`jobcore.catalog.worker_records`, `queries.JOB_TYPE_RECORD`).

The API and transactional enqueue accept the types recorded there (within
`jobcore.catalog.MAX_AGE`) without importing any handler code, and apply the recorded
options as defaults. Every worker process records on its own: the statement is an upsert,
safe to run concurrently, and nothing leads.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from jobcore.backoff import Retry
from jobcore.catalog import recorder_name, worker_records
from jobcore.periodic import Schedule
from jobqueue_worker.loops import Loop

log = logging.getLogger("jobqueue.worker")

# The spec's bound is a minute: refreshed twice as often, a record survives one failed round.
INTERVAL = 30.0


class RecordsTypes(Protocol):
    async def record_types(self, records: Sequence[tuple[str, str, str]], by: str) -> None: ...


class TypeRecord(Loop):
    """Records this process's types every `interval` seconds, the first time at once."""

    name = "type_record"

    def __init__(
        self, store: RecordsTypes, schedules: Sequence[Schedule], interval: float = INTERVAL
    ) -> None:
        super().__init__(interval, Retry(0.5, min(interval, 10.0)))
        self._store = store
        self._records = worker_records(schedules)
        self._by = recorder_name()
        self._logged = False

    async def run_once(self) -> list[str]:
        """Record the types once; returns them."""
        await self._store.record_types(self._records, self._by)
        if not self._logged:  # once: the refreshes repeat the same record
            self._logged = True
            log.info("job types recorded", extra={"types": [r[0] for r in self._records]})
        return [r[0] for r in self._records]
