"""Heartbeats: the leases of running attempts, renewed every LEASE_DURATION / 3.

One fenced statement renews every lease the process holds. A job row another
transaction holds locked is skipped, not waited for (its lease keeps its time, and the
next round tries again), so one lock cannot cost the other leases their renewal. A lease
the statement does not find was lost (it ran out and recovery, or another worker, took the job): the
attempt is stopped at once and its outcome never written. A lease whose time ran
out by this process's own clock is lost too, whatever the database would say:
while the database is unreachable no renewal applies, and after LEASE_DURATION
the job may run elsewhere. So a job can run for hours under a short lease, and a
frozen or partitioned worker loses its jobs after about LEASE_DURATION.

The renewal also says which of the jobs have had a cancel requested: the holder
stops those attempts as it does when it hears the request announced
(`jobqueue_worker.listener`), so a lost announcement delays a cancel by one
heartbeat at most.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import Protocol
from uuid import UUID

from jobcore.backoff import Retry
from jobcore.rows import Lease
from jobqueue_worker.database import JobStore
from jobqueue_worker.loops import Loop

log = logging.getLogger("jobqueue.worker")

# Renewals per lease: a lease survives two failed heartbeats in a row.
RENEWALS_PER_LEASE = 3


class Holder(Protocol):
    """Who runs the attempts (the executor)."""

    def leases(self) -> list[tuple[Lease, float]]: ...

    def renewed(self, leases: Collection[Lease], deadline: float) -> None: ...

    def lease_lost(self, lease: Lease) -> bool: ...

    def cancel(self, job_id: UUID, via: str) -> bool: ...


class Heartbeat(Loop):
    """Renews the leases `holder` holds; see the module docstring."""

    name = "heartbeat"

    def __init__(
        self,
        store: JobStore,
        holder: Holder,
        lease_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        interval = lease_seconds / RENEWALS_PER_LEASE
        super().__init__(interval, Retry(min(0.25, interval), interval))
        self._store = store
        self._holder = holder
        self._lease_seconds = lease_seconds
        self._clock = clock

    async def run_once(self) -> int:
        """Renew every lease held; returns how many were renewed."""
        now = self._clock()
        held = self._holder.leases()
        for lease, deadline in held:
            if deadline <= now:
                self._lost(lease, "the lease ran out before it could be renewed")
        # In job id order, as the completer writes: no deadlock between the two.
        live: Sequence[Lease] = sorted(lease for lease, deadline in held if deadline > now)
        if not live:
            return 0
        started = self._clock()
        # Not past the first of these leases to run out: by then it is lost whatever the
        # database answers, and the next round stops its attempt.
        left = min(deadline for _, deadline in held if deadline > now) - started
        async with asyncio.timeout(max(left, 0.0)):
            answer = await self._store.renew(live, self._lease_seconds)
        lost = set(answer.lost)
        busy = set(answer.busy)
        renewed = [lease for lease in live if lease not in lost and lease not in busy]
        # The new lease runs from the database's now() during the statement: measuring from
        # before the round trip errs on the safe side.
        self._holder.renewed(set(renewed), started + self._lease_seconds)
        for lease in lost:
            self._lost(lease, "the renewal matched no row")
        for lease in busy:
            # Its lease keeps the time it had: should the lock outlast it, the next round
            # finds the lease run out by this process's clock and stops the attempt.
            log.warning(
                "lease not renewed",
                extra={
                    "job_id": str(lease.job_id),
                    "lease_token": lease.lease_token,
                    "operation": "renew",
                    "error": "the job's row is locked by another transaction",
                },
            )
        for lease in answer.cancel:
            self._holder.cancel(lease.job_id, "renewal")
        return len(renewed)

    def _lost(self, lease: Lease, why: str) -> None:
        if not self._holder.lease_lost(lease):
            return  # the attempt had ended: its outcome write, racing the renewal, decides
        log.warning(
            "lease lost",
            extra={
                "job_id": str(lease.job_id),
                "lease_token": lease.lease_token,
                "operation": "renew",
                "error": why,
            },
        )
