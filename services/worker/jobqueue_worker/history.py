"""Moving completed jobs out of `jobs` (task HISTORY): the leader moves those finished more
than a minute ago (`jobcore.history.MOVE_AFTER`) to `jobs_history` every HISTORY_INTERVAL,
a batch at a time until none are left, so `jobs` keeps the live jobs and stays small
however many have run.

Batches are paced: after each, a pause as long as the batch took, so the move uses the
database at most half the time it runs and a queue finishing jobs faster than that still
gets its share. `jobs_moved_total` counts the jobs moved.

A batch reads the movable jobs from `MOVE_MARGIN` before the newest job this process has
moved, not from the head of `jobs_movable_idx`: under a held MVCC horizon the head keeps
an entry for every job moved since, which every read from it visits. A read from the
head (a sweep: the first of a leader, and for a job that committed late) comes 20 times
its cost after the last (`jobcore.floors.Sweeps`), so every round while it is cheap, and
at most SWEEP_MAX_INTERVAL apart.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from jobcore.floors import Sweeps
from jobcore.history import MOVE_AFTER, MOVE_MARGIN
from jobcore.maintenance import HISTORY
from jobqueue_worker import metrics
from jobqueue_worker.loops import sleep_until
from jobqueue_worker.maintenance import LedLoop, MaintenanceStore

HISTORY_INTERVAL = 5.0
HISTORY_LEASE_ROUNDS = 3
# Jobs per statement: each holds its row locks briefly.
MOVE_BATCH = 5000
MIN_MOVE_PAUSE = 0.02
SWEEP_COST_RATIO = 20.0
SWEEP_MAX_INTERVAL = 30.0  # sweeps never further apart than this


class History(LedLoop):
    """The leader of HISTORY moves the completed jobs without a key to `jobs_history` every
    `interval` seconds; RETENTION_COMPLETED sets how wide its leaves are."""

    name = "history"

    def __init__(
        self,
        store: MaintenanceStore,
        retention_completed: float,
        interval: float = HISTORY_INTERVAL,
        lease: float | None = None,
        batch: int = MOVE_BATCH,
        after: float = MOVE_AFTER,
    ) -> None:
        super().__init__(store, HISTORY, interval, lease or HISTORY_LEASE_ROUNDS * interval)
        self.retention = retention_completed
        self.batch = batch
        self.after = after
        self._stop = asyncio.Event()
        # Where the reads that are not sweeps start (less MOVE_MARGIN): when the newest job
        # this process moved finished, or where its last sweep that moved a full batch got.
        self.newest: datetime | None = None
        self.sweeps = Sweeps(SWEEP_COST_RATIO, SWEEP_MAX_INTERVAL, cheap=float("inf"))

    def _swept(self, began: float, full: bool, newest: datetime | None) -> None:
        """A read from the head ended (`newest`: when the newest job it moved finished).
        The next starts 20 times its cost later (at most SWEEP_MAX_INTERVAL). One that moved
        a full batch found a backlog: the reads go on from it, even below the newest job
        moved before. One that failed (a read from the head past the statement timeout,
        under a long-held horizon) leaves a leader that has moved nothing yet reading the
        jobs finishing now, so `jobs` keeps its size; the older ones move at a sweep that
        succeeds."""
        self.sweeps.done(began, time.monotonic())
        if newest is not None and (full or self.newest is None or newest > self.newest):
            self.newest = newest
        elif self.newest is None:
            self.newest = datetime.now(UTC) - timedelta(seconds=self.after)

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop  # a long run stops between batches
        await super().run(stop)

    async def run_once(self) -> int:
        """Move if this process leads the task; how many jobs it moved."""
        moved = 0
        if not await self.lead.take():
            return moved
        while True:
            began = time.monotonic()
            sweep = self.newest is None or self.sweeps.due(began)
            since = None if sweep or self.newest is None else self.newest - MOVE_MARGIN
            try:
                n, newest = await self.store.move_history(
                    self.retention, self.batch, self.after, since
                )
            except BaseException:
                if sweep:
                    self._swept(began, full=False, newest=None)
                raise
            if sweep:
                self._swept(began, full=n == self.batch, newest=newest)
            elif newest is not None and self.newest is not None and newest > self.newest:
                self.newest = newest
            if n:
                moved += n
                metrics.jobs_moved(n)
            if n < self.batch:
                return moved
            pause = max(MIN_MOVE_PAUSE, time.monotonic() - began)
            if await sleep_until(self._stop, pause) or not await self.lead.take():
                return moved
