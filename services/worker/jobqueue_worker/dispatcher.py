"""The dispatcher: claims as many jobs as there are free slots and hands each straight to a slot.

One claim round trip per wake-up, sized to the free slots of each queue the
process serves, so no job waits in memory while holding a lease. When a claim
leaves a queue's slots unfilled (nothing more is due there), the dispatcher asks
when that queue's next job is due (`next_due`) and waits until then, at most
POLL_INTERVAL: a scheduled job starts on time without fast polling. The wait is
cut short by `wake()` (a NOTIFY listener calls it when jobs are submitted, the
completer when it has put jobs off until later), and by a slot freeing up in a
queue whose last claim filled every slot (more work is likely waiting there). A
failed claim (database unavailable) is retried with a growing delay.

Under load most claims do not come from here: the completer's write that
records completed jobs also claims for the slots it frees (`claimable()`), in
the same statement, and hands what it claimed back (`hand_out()`), so a slot is
refilled by the commit that frees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from jobcore import logs
from jobcore.backoff import Retry
from jobcore.store import Claimed
from jobqueue_worker.database import JobStore

log = logging.getLogger("jobqueue.worker")

# Waking for a scheduled job this much after its run_at (by the database's clock, measured
# before a round trip) keeps a wake-up from coming a hair early and finding nothing due.
_DUE_MARGIN = 0.002


class Slots(Protocol):
    @property
    def free(self) -> dict[str, int]: ...

    def start(self, job: Claimed, lease_deadline: float) -> None: ...


class Dispatcher:
    """Claims jobs for `slots`; see the module docstring."""

    def __init__(
        self,
        store: JobStore,
        slots: Slots,
        *,
        poll_interval: float,
        lease_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._slots = slots
        self._poll_interval = poll_interval
        self._lease_seconds = lease_seconds
        self._clock = clock
        self._wake = asyncio.Event()
        # Queues whose last claim got every job it asked for: more may be waiting there.
        self._full: set[str] = set()
        self._stopping = False

    def wake(self) -> None:
        """Cut the idle wait short: new jobs may be due, or due at another time."""
        self._wake.set()

    def slot_freed(self, queue: str) -> None:
        # After a partial claim the queue was empty: a free slot alone is no reason to ask again.
        if queue in self._full:
            self._wake.set()

    @property
    def lease_seconds(self) -> float:
        return self._lease_seconds

    def claimable(self, freeing: Mapping[str, int]) -> dict[str, int]:
        """How many jobs of each queue an outcome write that frees `freeing` slots may claim."""
        return {} if self._stopping else dict(freeing)

    def hand_out(self, jobs: list[Claimed], asked: Mapping[str, int], claimed_at: float) -> None:
        """Start jobs that an outcome write claimed (`asked` for, per queue), in the slots it
        freed; `claimed_at` is when that write began (monotonic)."""
        self._note(jobs, asked)
        with logs.batch():
            for job in jobs:
                self._slots.start(job, claimed_at + self._lease_seconds)

    def stop(self) -> None:
        """Claim nothing more; `run()` returns once a claim in flight has been handed out."""
        self._stopping = True
        self._wake.set()

    def _note(self, jobs: list[Claimed], asked: Mapping[str, int]) -> None:
        got: dict[str, int] = {}
        for job in jobs:
            got[job.queue] = got.get(job.queue, 0) + 1
        for queue, n in asked.items():
            if got.get(queue, 0) >= n:
                self._full.add(queue)
            else:
                self._full.discard(queue)

    async def run(self) -> None:
        # Claims failing in a row (the database is unavailable): wait, not a busy loop.
        retry = Retry(0.25, 5.0)
        while not self._stopping:
            self._wake.clear()
            free = {queue: n for queue, n in self._slots.free.items() if n > 0}
            if not free:
                # Every slot is busy, so the last claims filled them: slot_freed() wakes us.
                await self._wake.wait()
                continue
            # The lease starts at the database's now() during the claim, so measuring from
            # before the round trip errs on the safe side.
            claimed_at = self._clock()
            try:
                jobs = await self._store.claim(free, self._lease_seconds)
            except Exception:
                # PgJobStore logs the outage once; back off so an outage is not a busy loop.
                self._full.clear()
                log.debug("claim failed", exc_info=True)
                await self._idle(retry.failed())
                continue
            retry.succeeded()
            self._note(jobs, free)
            # A line per job started: one write for the claim.
            with logs.batch():
                for job in jobs:
                    self._slots.start(job, claimed_at + self._lease_seconds)
            drained = [queue for queue in free if queue not in self._full]
            if drained:
                await self._idle(await self._until_next_due(drained))

    async def _until_next_due(self, queues: list[str]) -> float:
        """How long to wait for these queues: until their next job is due, at most
        POLL_INTERVAL (and POLL_INTERVAL if the database cannot say)."""
        try:
            seconds = await self._store.next_due(queues)
        except Exception:
            log.debug("next_due failed", exc_info=True)
            return self._poll_interval
        if seconds is None:
            return self._poll_interval
        return min(self._poll_interval, max(seconds, 0.0) + _DUE_MARGIN)

    async def _idle(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()
