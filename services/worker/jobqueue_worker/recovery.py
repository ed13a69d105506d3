"""The recovery loop: at start and every RECOVERY_INTERVAL, expired leases are taken back.

A job whose lease ran out (its worker crashed, hung or lost the database) goes
back to pending, or to dead_letter if that was its last attempt; so a job that
kills its worker every time ends in dead_letter instead of looping. Every
worker process runs the loop; the statement is safe to run concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from jobcore.states import Status
from jobcore.store import RECOVER_BATCH
from jobqueue_worker import metrics
from jobqueue_worker.database import JobStore

log = logging.getLogger("jobqueue.worker")


async def recover_once(store: JobStore) -> int:
    """Run recover_expired until no expired lease is left (it takes at most RECOVER_BATCH
    jobs a statement); returns how many jobs it took back, those before a database failure."""
    total = 0
    while True:
        try:
            recovered = await store.recover_expired()
        except Exception:
            log.debug("recover_expired failed", exc_info=True)  # PgJobStore logs the outage
            return total
        for job_id, status in recovered:
            log.warning("job recovered", extra={"job_id": str(job_id), "status": status.value})
        if recovered:
            dead = sum(1 for _, status in recovered if status is Status.DEAD_LETTER)
            metrics.jobs_recovered(dead_lettered=dead, total=len(recovered))
        total += len(recovered)
        if len(recovered) < RECOVER_BATCH:
            return total


async def run_recovery(store: JobStore, interval: float, stopped: asyncio.Event) -> None:
    """recover_once now and every `interval` seconds until `stopped` is set."""
    while not stopped.is_set():
        await recover_once(store)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval):
                await stopped.wait()
