"""The dispatcher: claims as many jobs as there are free slots and hands each straight to a slot.

One claim round trip per wake-up, sized to the free slots, so no job waits in
memory while holding a lease. Idle, the dispatcher waits POLL_INTERVAL on an
event that `wake()` sets early (a NOTIFY listener may call it), as does a slot
freeing up right after a claim that filled every slot (more work is likely
waiting). A failed claim (database unavailable) is retried with a growing delay.

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
from collections.abc import Callable
from typing import Protocol

from jobcore import logs
from jobcore.backoff import Retry
from jobcore.store import Claimed
from jobqueue_worker.database import JobStore

log = logging.getLogger("jobqueue.worker")


class Slots(Protocol):
    @property
    def free(self) -> int: ...

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
        self._last_claim_full = False
        self._stopping = False

    def wake(self) -> None:
        """Cut the idle wait short: new jobs may be due."""
        self._wake.set()

    def slot_freed(self) -> None:
        # After a partial claim the queue was empty: a free slot alone is no reason to ask again.
        if self._last_claim_full:
            self._wake.set()

    @property
    def lease_seconds(self) -> float:
        return self._lease_seconds

    def claimable(self, freeing: int) -> int:
        """How many jobs an outcome write that frees `freeing` slots may claim for them."""
        return 0 if self._stopping else freeing

    def hand_out(self, jobs: list[Claimed], asked: int, claimed_at: float) -> None:
        """Start jobs that an outcome write claimed (`asked` for), in the slots it freed;
        `claimed_at` is when that write began (monotonic)."""
        self._last_claim_full = len(jobs) >= asked
        with logs.batch():
            for job in jobs:
                self._slots.start(job, claimed_at + self._lease_seconds)

    def stop(self) -> None:
        """Claim nothing more; `run()` returns once a claim in flight has been handed out."""
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        # Claims failing in a row (the database is unavailable): wait, not a busy loop.
        retry = Retry(0.25, 5.0)
        while not self._stopping:
            self._wake.clear()
            free = self._slots.free
            if free <= 0:
                # Every slot is busy, so the last claim filled them: slot_freed() wakes us.
                await self._wake.wait()
                continue
            # The lease starts at the database's now() during the claim, so measuring from
            # before the round trip errs on the safe side.
            claimed_at = self._clock()
            try:
                jobs = await self._store.claim(free, self._lease_seconds)
            except Exception:
                # PgJobStore logs the outage once; back off so an outage is not a busy loop.
                self._last_claim_full = False
                log.debug("claim failed", exc_info=True)
                await self._idle(retry.failed())
                continue
            retry.succeeded()
            self._last_claim_full = len(jobs) >= free
            # A line per job started: one write for the claim.
            with logs.batch():
                for job in jobs:
                    self._slots.start(job, claimed_at + self._lease_seconds)
            if not self._last_claim_full:
                await self._idle(self._poll_interval)

    async def _idle(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()
