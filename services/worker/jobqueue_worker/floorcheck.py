"""The check of the claim floors: now and then, off the claims' path, each worker process
reads the earliest due job of each of its queues and priorities from the head of the claim
index and lowers a floor that a job lies below (`jobcore.floors`). Paced by what the read
costs: every second on a table without dead entries, up to every 5 s under a held MVCC
horizon, where the read is long and the claims, reading from their floors, do not wait for
it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from jobcore.backoff import Retry
from jobcore.floors import MIN_CHECK_INTERVAL, check_interval
from jobqueue_worker.loops import Loop


class FloorStore(Protocol):
    async def check_floors(self, queues: Sequence[str]) -> float: ...


class FloorCheck(Loop):
    """`check_floors` every `check_interval(its cost)` seconds."""

    name = "floor_check"

    def __init__(self, store: FloorStore, queues: Sequence[str]) -> None:
        super().__init__(MIN_CHECK_INTERVAL, Retry(0.25, 5.0))
        self._store = store
        self._queues = list(queues)

    async def run_once(self) -> float:
        cost = await self._store.check_floors(self._queues)
        self.interval = check_interval(cost)
        return cost

    def failed(self, exc: Exception) -> None:
        pass  # PgJobStore logs the database's outage

    def recovered(self) -> None:
        pass  # and its end
