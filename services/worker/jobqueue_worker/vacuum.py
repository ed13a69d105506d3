"""Vacuum where autovacuum does not: the leader of task VACUUM vacuums each of jobqueue's
tables that autovacuum leaves alone (off on the server, or turned off for the table) once
it holds VACUUM_DEAD_TUPLES dead tuples.

A queue's table turns over all the time: every job leaves two or three dead row versions,
and without vacuum the table and its indexes only grow, and every read of them slows. With
autovacuum on, this loop does nothing. A vacuum that leaves the table with as many dead
tuples as it found (something holds the MVCC horizon, docs/pressure.md) is not repeated at
once: that table waits 30 s, then twice as long each time, up to 5 minutes.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from jobcore.maintenance import VACUUM
from jobcore.rows import TableStats
from jobqueue_worker.maintenance import LedLoop, MaintenanceStore

log = logging.getLogger("jobqueue.worker")

VACUUM_INTERVAL = 10.0
# A leader that dies is replaced within a minute; a vacuum may take a while.
VACUUM_LEASE_ROUNDS = 6
HELD_BACK_FIRST = 30.0
HELD_BACK_MAX = 300.0


class Vacuum(LedLoop):
    """Every `interval` seconds, the leader vacuums the tables autovacuum does not once
    they hold `dead_tuples` dead tuples (0: never)."""

    name = "vacuum"

    def __init__(
        self,
        store: MaintenanceStore,
        dead_tuples: int,
        interval: float = VACUUM_INTERVAL,
        lease: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(store, VACUUM, interval, lease or VACUUM_LEASE_ROUNDS * interval)
        self.dead_tuples = dead_tuples
        self._clock = clock
        self._not_before: dict[str, float] = {}
        self._held_back: dict[str, float] = {}
        self._told: set[str] = set()

    async def run_once(self) -> list[str]:
        """Vacuum what needs it if this process leads the task; the tables vacuumed."""
        if not self.dead_tuples or not await self.lead.take():
            return []
        vacuumed: list[str] = []
        for table in await self.store.table_stats():
            if table.autovacuum:
                self._told.discard(table.name)
                continue
            if table.name not in self._told:
                self._told.add(table.name)
                log.info(
                    "autovacuum is off for a table: the worker vacuums it",
                    extra={"table": table.name, "dead_tuples": self.dead_tuples},
                )
            if table.dead < self.dead_tuples:
                continue
            if self._clock() < self._not_before.get(table.name, -math.inf):
                continue
            await self._vacuum(table)
            vacuumed.append(table.name)
            if not self.lead.held:
                break
        return vacuumed

    async def _vacuum(self, table: TableStats) -> None:
        started = self._clock()
        await self.store.vacuum(table.name)
        took = self._clock() - started
        after = {t.name: t.dead for t in await self.store.table_stats()}
        left = after.get(table.name, 0)
        fields = {
            "table": table.name,
            "dead_before": table.dead,
            "dead_after": left,
            "duration_ms": round(took * 1000, 1),
        }
        if left >= self.dead_tuples:
            # Nothing it could remove: the horizon is held. Try again later, not each round.
            wait = min(2 * self._held_back.get(table.name, HELD_BACK_FIRST / 2), HELD_BACK_MAX)
            self._held_back[table.name] = wait
            self._not_before[table.name] = self._clock() + wait
            log.info("table vacuumed, dead tuples held back", extra={**fields, "next_s": wait})
            return
        self._held_back.pop(table.name, None)
        self._not_before.pop(table.name, None)
        log.info("table vacuumed", extra=fields)
