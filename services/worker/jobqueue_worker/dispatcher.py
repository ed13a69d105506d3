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
refilled by the commit that frees it. Such a write also claims for the slots
that are free and that no other claim is for: where a write's claim came back
short (fewer due jobs, or keys with room, than the slots it freed) while jobs
still run here, the dispatcher leaves the idle slots to the next write for
MERGE_WAIT (never past the time a job is due) rather than claiming for them in
a statement of their own. Without that, the jobs of a process split for good
into groups that end and are written apart, twice the statements for the same
jobs.

Types with a limit (TYPE_CONCURRENCY, TYPE_RATE) are claimed here only, first in each
claim (`claim_limited`), ranked against the other types' due jobs in claim order, so a
limited backlog never takes a slot a job of higher priority is due for; the free slots
left go to the other types in the same round. The completer's claims
skip them, and leave their slots to the dispatcher while a limited claim is wanted:
after a job of a limited type of this process ended (or a handler that outlived its
attempt returned: it held its unit until then), when the rate window that held a type
back has rolled over, at least every POLL_INTERVAL (other processes' jobs ending), and
while the last limited claim took every slot it was offered with a limited type still
below its limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Protocol
from uuid import UUID

from jobcore import logs
from jobcore.backoff import Retry
from jobcore.rows import Claimed, Lease, LimitedClaim, TypeLimits
from jobqueue_worker.database import JobStore

log = logging.getLogger("jobqueue.worker")

# Waking for a scheduled job this much after its run_at (by the database's clock, measured
# before a round trip) keeps a wake-up from coming a hair early and finding nothing due.
_DUE_MARGIN = 0.002
# The same for a rate window that opens on the database's clock.
_WINDOW_MARGIN = 0.005
# Jobs of limited types remembered before those no longer running are forgotten.
_LIMITED_KEPT = 10_000
# How long the slots an outcome write's short claim left idle wait for the next write to
# claim for them, while jobs still run in this process (a write of no-op jobs comes within
# milliseconds; longer jobs leave them to the dispatcher after this).
MERGE_WAIT = 0.02


class Slots(Protocol):
    @property
    def free(self) -> dict[str, int]: ...

    @property
    def running(self) -> int: ...

    def start(self, job: Claimed, lease_deadline: float) -> None: ...

    def leases(self) -> list[tuple[Lease, float]]: ...

    def overruns(self) -> dict[str, int]: ...


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
        limits: TypeLimits | None = None,
        paused: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        self._store = store
        # The queues claimed from by nobody now (`jobqueue_worker.pauses`).
        self._paused = paused
        # Per-type limits: None when there are none (nothing below costs anything then).
        self._limits = limits if limits is not None and limits.types else None
        # Jobs of limited types this process runs, and whether one of them has ended since
        # the last limited claim.
        self._limited_running: set[UUID] = set()
        self._limited_ended = False
        # Monotonic time from which a limited claim is wanted again (rate window, poll).
        self._limited_at = 0.0
        self._slots = slots
        self._poll_interval = poll_interval
        self._lease_seconds = lease_seconds
        self._clock = clock
        self._wake = asyncio.Event()
        # Queues whose last claim got every job it asked for: more may be waiting there.
        self._full: set[str] = set()
        # The free slots the dispatcher's claim in flight is for, and those an outcome
        # write's claim in flight is for beyond the ones it frees: no other claim counts them.
        self._claiming: dict[str, int] = {}
        self._held: dict[str, int] = {}
        # Until when free slots are left to the next outcome write, and when a drained
        # queue's next job is due (or the poll, or a rate window, is): monotonic.
        self._merge_until = 0.0
        self._due_at = float("inf")
        self._stopping = False

    def wake(self) -> None:
        """Cut the idle wait short: new jobs may be due, or due at another time."""
        self._merge_until = 0.0
        self._wake.set()

    def slot_freed(self, queue: str) -> None:
        # After a partial claim the queue was empty: a free slot alone is no reason to ask again.
        if queue in self._full or (self._limits is not None and self._limited_wanted()):
            self._wake.set()

    def finishing(self, job_ids: Iterable[UUID], written: bool) -> None:
        """The completer writes (`written`: has written) the outcomes of these jobs."""
        if not self._limited_running:
            return
        ended = [job_id for job_id in job_ids if job_id in self._limited_running]
        if ended:
            self._limited_ended = True
            if written:
                self._limited_running.difference_update(ended)
                self._wake.set()

    def _limited_wanted(self) -> bool:
        return self._limited_ended or self._clock() >= self._limited_at

    @property
    def lease_seconds(self) -> float:
        return self._lease_seconds

    def _unclaimed(self) -> dict[str, int]:
        """The free slots per queue that no claim in flight is for."""
        return {
            queue: n - self._claiming.get(queue, 0) - self._held.get(queue, 0)
            for queue, n in self._slots.free.items()
        }

    def claimable(self, freeing: Mapping[str, int]) -> dict[str, int]:
        """How many jobs of each queue an outcome write that frees `freeing` slots may claim:
        those, and the free slots no other claim is for, which are the write's until
        `hand_out()` or `claim_dropped()`."""
        if self._stopping or (self._limits is not None and self._limited_wanted()):
            return {}
        paused = self._paused()
        self._held = {q: n for q, n in self._unclaimed().items() if n > 0 and q not in paused}
        wanted = {q: n for q, n in freeing.items() if q not in paused}
        for queue, n in self._held.items():
            wanted[queue] = wanted.get(queue, 0) + n
        return wanted

    def hand_out(self, jobs: list[Claimed], asked: Mapping[str, int], claimed_at: float) -> None:
        """Start jobs that an outcome write claimed (`asked` for, per queue), in the slots it
        freed and those it held; `claimed_at` is when that write began (monotonic)."""
        held, self._held = self._held, {}
        got = self._note(jobs, asked)
        with logs.batch():
            for job in jobs:
                self._slots.start(job, claimed_at + self._lease_seconds)
        # A queue whose freed slots the write did not refill: its idle slots wait for the
        # next write while jobs still run here (the split this avoids is of those jobs).
        short = any(got.get(q, 0) < n for q, n in asked.items() if n > held.get(q, 0))
        self._merge_until = self._clock() + MERGE_WAIT if short and self._slots.running else 0.0
        if held or short:
            # The dispatcher may have found every free slot held, or left one to this write.
            self._wake.set()

    def claim_dropped(self) -> None:
        """An outcome write's claim failed: the slots it held are free for any claim."""
        self._held = {}
        self._merge_until = 0.0
        self._wake.set()

    def stop(self) -> None:
        """Claim nothing more; `run()` returns once a claim in flight has been handed out."""
        self._stopping = True
        self._wake.set()

    def _note(self, jobs: list[Claimed], asked: Mapping[str, int]) -> dict[str, int]:
        """Which queues the claim filled; the jobs it got per queue."""
        got: dict[str, int] = {}
        for job in jobs:
            got[job.queue] = got.get(job.queue, 0) + 1
        for queue, n in asked.items():
            if got.get(queue, 0) >= n:
                self._full.add(queue)
            else:
                self._full.discard(queue)
        return got

    async def run(self) -> None:
        # Claims failing in a row (the database is unavailable): wait, not a busy loop.
        retry = Retry(0.25, 5.0)
        while not self._stopping:
            self._wake.clear()
            paused = self._paused()
            free = {q: n for q, n in self._unclaimed().items() if n > 0 and q not in paused}
            if not free:
                # Every slot is busy, so the last claims filled them: slot_freed() wakes us
                # (or every queue with a free slot is paused: its resume wakes us).
                await self._wake.wait()
                continue
            # Never past the time a job is due: that one is claimed at once.
            merging = min(self._merge_until, self._due_at) - self._clock()
            if merging > 0 and not (self._limits is not None and self._limited_wanted()):
                # The next outcome write claims for these slots too (see the docstring).
                await self._idle(merging)
                continue
            # The lease starts at the database's now() during the claim, so measuring from
            # before the round trip errs on the safe side.
            claimed_at = self._clock()
            self._claiming = free
            self._due_at = float("inf")
            try:
                try:
                    jobs = await self._claim(free)
                finally:
                    self._claiming = {}
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
                wait = await self._until_next_due(drained)
                limited = self._limited_wait()
                # A rate window that opens sooner ends the wait.
                wait = wait if limited is None else min(wait, limited)
                self._due_at = self._clock() + wait
                await self._idle(wait)

    async def _claim(self, free: dict[str, int]) -> list[Claimed]:
        if self._limits is None:
            return await self._store.claim(free, self._lease_seconds)
        got = await self._store.claim_limited(free, self._lease_seconds, self._slots.overruns())
        self._limited_claimed(got, sum(free.values()))
        rest = dict(free)
        for job in got.jobs:
            rest[job.queue] -= 1
        rest = {queue: n for queue, n in rest.items() if n > 0}
        if not rest:
            return got.jobs
        try:
            return got.jobs + await self._store.claim(rest, self._lease_seconds)
        except Exception:
            # The limited jobs are leased: they start; the next round claims the rest.
            log.debug("claim failed", exc_info=True)
            return got.jobs

    def _limited_claimed(self, got: LimitedClaim, offered: int) -> None:
        assert self._limits is not None
        self._limited_ended = False
        now = self._clock()
        limited = self._limits.types
        if len(got.jobs) >= offered and any(name not in got.held for name in limited):
            # Every slot went to limited jobs, and a type still had room: more may be
            # waiting. Otherwise the next slots go to the completer's claims, which skip the
            # limited types: limited jobs outranked here come after the jobs taken instead
            # in claim order, and are ranked again when a limited job ends, a rate window
            # opens, or after POLL_INTERVAL at the latest.
            self._limited_at = now
        elif got.wait is not None:
            self._limited_at = now + min(got.wait + _WINDOW_MARGIN, self._poll_interval)
        else:
            self._limited_at = now + self._poll_interval
        if len(self._limited_running) > _LIMITED_KEPT:
            # Jobs whose lease was lost end without an outcome write: forget them.
            self._limited_running &= {lease.job_id for lease, _ in self._slots.leases()}
        self._limited_running.update(job.id for job in got.jobs)
        for job_type, limit in got.held.items():
            log.debug(
                "job type held back by its limit", extra={"job_type": job_type, "limit": limit}
            )

    def overrun_ended(self, job: Claimed) -> None:
        """A handler that outlived its recorded attempt returned: if its type is limited, it
        gave back a unit of TYPE_CONCURRENCY, so a limited claim is wanted; if its job has a
        key, a unit of KEY_CONCURRENCY, so a claim is."""
        if self._limits is not None and job.type in self._limits.concurrency:
            self._limited_ended = True
            self._wake.set()
        if job.concurrency_key is not None:
            self._wake.set()

    def _limited_wait(self) -> float | None:
        if self._limits is None:
            return None
        return max(self._limited_at - self._clock(), 0.0)

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
