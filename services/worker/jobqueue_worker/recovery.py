"""The recovery loop: at start and every RECOVERY_INTERVAL, expired leases are taken back.

A job whose lease ran out (its worker crashed, hung or lost the database) goes
back to pending, or to dead_letter if that was its last attempt; so a job that
kills its worker every time ends in dead_letter instead of looping. A job whose
cancel was requested ends cancelled instead. Every
worker process runs the loop; the statement is safe to run concurrently.
"""

from __future__ import annotations

import logging

from jobcore.backoff import Retry
from jobcore.queries import RECOVER_BATCH
from jobcore.states import Status
from jobqueue_worker import metrics
from jobqueue_worker.database import JobStore
from jobqueue_worker.loops import Loop

log = logging.getLogger("jobqueue.worker")


class Recovery(Loop):
    """`recover_expired` until no expired lease is left, every `interval` seconds."""

    name = "recovery"

    def __init__(self, store: JobStore, interval: float) -> None:
        first = min(0.25, interval)
        super().__init__(interval, Retry(first, max(first, min(interval, 5.0))))
        self._store = store

    async def run_once(self) -> int:
        """Take back every expired lease (at most RECOVER_BATCH a statement); returns how many."""
        total = 0
        while True:
            recovered = await self._store.recover_expired()
            for job_id, status in recovered:
                log.warning("job recovered", extra={"job_id": str(job_id), "status": status.value})
            if recovered:
                dead = sum(1 for _, status in recovered if status is Status.DEAD_LETTER)
                cancelled = sum(1 for _, status in recovered if status is Status.CANCELLED)
                metrics.jobs_recovered(
                    dead_lettered=dead, total=len(recovered), cancelled=cancelled
                )
            total += len(recovered)
            if len(recovered) < RECOVER_BATCH:
                return total

    def failed(self, exc: Exception) -> None:
        log.debug("recover_expired failed", exc_info=exc)  # PgJobStore logs the outage

    def recovered(self) -> None:
        pass  # and its end
