"""Work one worker process does for the whole database: the queue gauges and retention.

Every worker process runs both loops, and each round starts by taking the task's lead
(`jobcore.maintenance`): the process whose lease is valid does the work and renews the
lease; the others do nothing that round. No coordinator: a leader that stops resigns, so
another takes over at its next round; one that dies or loses the database is replaced once
its lease runs out.

- `QueueGauges` (task GAUGES) sets `jobs_queued` and `jobs_oldest_pending_age_seconds`
  every GAUGES_INTERVAL. A process that does not lead, or can no longer be sure it does
  (its lease may have run out), exports no queue gauges at all.
- `Retention` (task RETENTION) deletes, every RETENTION_INTERVAL, the finished jobs older
  than their status's retention (RETENTION_COMPLETED, RETENTION_FAILED,
  RETENTION_DEAD_LETTER; 0 keeps them), at most PRUNE_BATCH per statement, pausing
  between statements as long as the last one took (completed jobs in `jobs_history` first,
  a whole leaf at a time, unpaced), and counts them in `jobs_pruned_total`;
  a run that goes through every status sets `jobs_retention_last_run_timestamp_seconds`.
- `jobqueue_worker.vacuum.Vacuum` (task VACUUM) vacuums the tables autovacuum leaves alone.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Protocol
from uuid import UUID, uuid4

from jobcore.backoff import Retry
from jobcore.floors import CountFloors
from jobcore.maintenance import GAUGES, PRUNE_BATCH, RETENTION
from jobcore.rows import Moved, TableStats
from jobcore.search import QueueDepth
from jobcore.settings import WorkerSettings
from jobcore.states import Status
from jobqueue_worker import metrics
from jobqueue_worker.loops import Loop, sleep_until

log = logging.getLogger("jobqueue.worker")

# The queue gauges are refreshed every GAUGES_INTERVAL under a lease of GAUGES_LEASE_ROUNDS
# refreshes: a leader that dies is replaced within 4 refreshes (8 s), one that resigns at the
# next (2 s).
GAUGES_INTERVAL = 2.0
GAUGES_LEASE_ROUNDS = 3
# Retention runs every RETENTION_INTERVAL; its leader renews its lease at each run and
# between statements, so a long run keeps it. One that dies is replaced within 90 s.
RETENTION_INTERVAL = 30.0
RETENTION_LEASE_ROUNDS = 2
# The least pause between two prune statements of a run.
MIN_PRUNE_PAUSE = 0.05
# A full batch starts at most once per batch interval (by default PRUNE_BATCH_INTERVAL: 5,000
# rows/s, 18 million jobs an hour, more than a deployment finishes for long; RETENTION_RATE
# sets it), and pauses at least PRUNE_PAUSE_FACTOR times its own duration (a slow database
# is deleted from at most a quarter of the time). Deleting as fast as the database allows
# cost a drain at full speed ~15 % of its rate; paced like this, a backlog of old rows is
# worked off over minutes at no cost measurable.
PRUNE_BATCH_INTERVAL = 1.0
PRUNE_PAUSE_FACTOR = 3.0
# A resignation that takes longer (the database is away) is given up: the lease runs out on
# its own, and the process's shutdown is not held up. It may first wait for the other loop's
# statement (the server stops those after STATEMENT_TIMEOUT, 4 s).
RESIGN_TIMEOUT = 5.0


class MaintenanceStore(Protocol):
    """The store calls the maintenance loops make (`PgJobStore` has them)."""

    async def take_lead(self, task: str, holder: UUID, lease_seconds: float) -> bool: ...

    async def resign(self, task: str, holder: UUID) -> None: ...

    async def queue_depths(
        self, floors: CountFloors | None = None, sweep: bool = True
    ) -> list[QueueDepth]: ...

    async def paused_queues(self) -> frozenset[str]: ...

    async def prune(self, status: Status, age_seconds: float) -> int: ...

    async def drop_history(self, age_seconds: float) -> int | None: ...

    async def move_history(
        self, retention_seconds: float, batch: int, after: float, since: datetime | None
    ) -> Moved: ...

    async def table_stats(self) -> list[TableStats]: ...

    async def vacuum(self, table: str) -> None: ...


class TakingTurns:
    """A `MaintenanceStore` whose calls wait for each other: the loops sharing it never make
    two calls at once, so together they use one pooled connection."""

    def __init__(self, store: MaintenanceStore) -> None:
        self._store = store
        self._turn = asyncio.Lock()

    async def take_lead(self, task: str, holder: UUID, lease_seconds: float) -> bool:
        async with self._turn:
            return await self._store.take_lead(task, holder, lease_seconds)

    async def resign(self, task: str, holder: UUID) -> None:
        async with self._turn:
            await self._store.resign(task, holder)

    async def queue_depths(
        self, floors: CountFloors | None = None, sweep: bool = True
    ) -> list[QueueDepth]:
        async with self._turn:
            return await self._store.queue_depths(floors, sweep)

    async def paused_queues(self) -> frozenset[str]:
        async with self._turn:
            return await self._store.paused_queues()

    async def prune(self, status: Status, age_seconds: float) -> int:
        async with self._turn:
            return await self._store.prune(status, age_seconds)

    async def drop_history(self, age_seconds: float) -> int | None:
        async with self._turn:
            return await self._store.drop_history(age_seconds)

    async def move_history(
        self, retention_seconds: float, batch: int, after: float, since: datetime | None
    ) -> Moved:
        async with self._turn:
            return await self._store.move_history(retention_seconds, batch, after, since)

    async def table_stats(self) -> list[TableStats]:
        async with self._turn:
            return await self._store.table_stats()

    async def vacuum(self, table: str) -> None:
        # A connection of its own: the other loops go on meanwhile.
        await self._store.vacuum(table)


class Lead:
    """This process's lead of one maintenance task, as far as it can know it."""

    def __init__(
        self,
        store: MaintenanceStore,
        task: str,
        lease: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.task = task
        self.lease = lease
        self.holder = uuid4()
        self._store = store
        self._clock = clock
        # When the lease surely runs out, by this process's clock: it was asked for before
        # the call that took it started.
        self._until = -math.inf
        # The database may hold our lease: we took it, or a take's answer was lost.
        self._maybe_held = False
        # Whether the logs last said this process leads.
        self._said_held = False

    @property
    def held(self) -> bool:
        """Whether this process leads the task now (its last lease has not run out)."""
        return self._clock() < self._until

    async def take(self) -> bool:
        """Take or renew the lead for `lease` seconds; whether this process leads now."""
        started = self._clock()
        self._maybe_held = True
        try:
            led = await self._store.take_lead(self.task, self.holder, self.lease)
        except BaseException:
            self._say("lease ran out")
            raise
        if led:
            self._until = started + self.lease
        else:
            self._until = -math.inf
            self._maybe_held = False
        self._say("another worker leads")
        return led

    async def resign(self) -> None:
        """Stop leading and let another worker lead at once (at shutdown). If the database
        cannot be told, the lease runs out on its own."""
        self._until = -math.inf
        resigned = False
        if self._maybe_held:
            try:
                async with asyncio.timeout(RESIGN_TIMEOUT):
                    await self._store.resign(self.task, self.holder)
                resigned, self._maybe_held = True, False
            except Exception:
                log.debug("resign failed", extra=self._fields(), exc_info=True)
        if self._said_held:
            self._said_held = False
            log.info("maintenance lead given up", extra={**self._fields(), "resigned": resigned})

    def _say(self, reason: str) -> None:
        """Log a change of lead since the last one logged."""
        held = self.held
        if held and not self._said_held:
            log.info("maintenance lead taken", extra=self._fields())
        elif self._said_held and not held:
            log.info("maintenance lead lost", extra={**self._fields(), "reason": reason})
        self._said_held = held

    def _fields(self) -> dict[str, str]:
        return {"task": self.task, "holder": str(self.holder)}


class LedLoop(Loop):
    """A loop whose work is done by the leader of `task` only; at its end it resigns."""

    def __init__(self, store: MaintenanceStore, task: str, interval: float, lease: float) -> None:
        if lease <= interval:
            raise ValueError(f"{task}: the lease ({lease}s) must outlast a round ({interval}s)")
        first = min(0.25, interval)
        super().__init__(interval, Retry(first, max(first, min(interval, 5.0))))
        self.store = store
        self.lead = Lead(store, task, lease)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await super().run(stop)
        finally:
            self.ended()
            await self.lead.resign()

    def ended(self) -> None:
        """Called when the loop ends, before it resigns."""

    def failed(self, exc: Exception) -> None:
        log.debug("maintenance round failed", extra={"loop": self.name}, exc_info=exc)

    def recovered(self) -> None:
        pass  # PgJobStore logs the database's outage and its end


class QueueGauges(LedLoop):
    """The leader of GAUGES sets the queue gauges every `interval` seconds, reading from
    its count floors (`jobcore.floors.CountFloors`) between sweeps."""

    name = "queue_gauges"

    def __init__(
        self,
        store: MaintenanceStore,
        interval: float = GAUGES_INTERVAL,
        lease: float | None = None,
    ) -> None:
        super().__init__(store, GAUGES, interval, lease or GAUGES_LEASE_ROUNDS * interval)
        self.floors = CountFloors()

    async def run_once(self) -> list[QueueDepth] | None:
        """Refresh the gauges if this process leads them; the depths it exported, or None."""
        try:
            if await self.lead.take():
                depths = await self._depths()
                paused = await self.store.paused_queues()
                # A paused queue without jobs is shown too, with nothing in it.
                empty = paused - {depth.queue for depth in depths}
                depths += [QueueDepth(queue, 0, 0, 0, 0, 0.0) for queue in sorted(empty)]
                # Still ours after the read: a slow read must not show under a lost lead.
                if self.lead.held:
                    metrics.show_queue_depths(depths, paused)
                    return depths
        except BaseException:
            if not self.lead.held:
                metrics.hide_queue_depths()
            raise
        metrics.hide_queue_depths()
        return None

    async def _depths(self) -> list[QueueDepth]:
        started = time.monotonic()
        sweep = self.floors.sweeps.due(started)
        try:
            return await self.store.queue_depths(self.floors, sweep)
        finally:
            # A sweep that failed (past the statement timeout, under a horizon held for
            # long) counts as one: the rounds after it read from the floors meanwhile.
            if sweep:
                self.floors.sweeps.done(started, time.monotonic())

    def ended(self) -> None:
        metrics.hide_queue_depths()


def retention_ages(settings: WorkerSettings) -> dict[Status, float]:
    """Per finished status, the age (seconds since it finished) at which a job is deleted;
    0: kept forever."""
    return {
        Status.COMPLETED: settings.retention_completed,
        Status.FAILED: settings.retention_failed,
        Status.CANCELLED: settings.retention_failed,
        Status.DEAD_LETTER: settings.retention_dead_letter,
    }


class Retention(LedLoop):
    """The leader of RETENTION deletes the finished jobs past their age every `interval`
    seconds. A process whose retentions are all 0 does not contend for the lead."""

    name = "retention"

    def __init__(
        self,
        store: MaintenanceStore,
        ages: Mapping[Status, float],
        interval: float = RETENTION_INTERVAL,
        lease: float | None = None,
        batch_interval: float = PRUNE_BATCH_INTERVAL,
    ) -> None:
        super().__init__(store, RETENTION, interval, lease or RETENTION_LEASE_ROUNDS * interval)
        self.ages = {status: age for status, age in ages.items() if age > 0}
        self.batch_interval = batch_interval
        self._stop = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop  # a long run stops between statements
        await super().run(stop)

    async def run_once(self) -> dict[Status, int]:
        """Prune if this process leads retention; the jobs deleted, by status."""
        pruned = {status: 0 for status in self.ages}
        if not self.ages or not await self.lead.take():
            return pruned
        started = time.monotonic()
        try:
            for status, age in self.ages.items():
                if not await self._prune(status, age, pruned):
                    break
            else:
                metrics.retention_ran()
        finally:
            if any(pruned.values()):
                log.info(
                    "jobs pruned",
                    extra={
                        "pruned": {str(s): n for s, n in pruned.items() if n},
                        "total": sum(pruned.values()),
                        "duration_ms": round((time.monotonic() - started) * 1000, 1),
                    },
                )
        return pruned

    async def _prune(self, status: Status, age: float, pruned: dict[Status, int]) -> bool:
        """Delete `status`'s jobs older than `age` until a statement finds fewer than a full
        batch; False if the run must end (stopping, or the lead was lost). Completed jobs
        in `jobs_history` go first, a leaf at a time, unpaced: a DROP writes no row."""
        while status is Status.COMPLETED:
            dropped = await self.store.drop_history(age)
            if dropped is None:
                break
            pruned[status] += dropped
            metrics.jobs_pruned(status, dropped)
            if self._stop.is_set() or not await self.lead.take():
                return False
        while True:
            began = time.monotonic()
            n = await self.store.prune(status, age)
            if n:
                pruned[status] += n
                metrics.jobs_pruned(status, n)
            if n < PRUNE_BATCH:
                return True
            # Paced: the rows a statement locked, the WAL and the I/O it caused leave room
            # for the queue's own work.
            took = time.monotonic() - began
            pause = max(MIN_PRUNE_PAUSE, PRUNE_PAUSE_FACTOR * took, self.batch_interval - took)
            if await sleep_until(self._stop, pause) or not await self.lead.take():
                return False
