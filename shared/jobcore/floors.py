"""Claim floors: where a worker's claims start reading the claim index, and when they
read it from the head instead (a sweep).

While something holds PostgreSQL's MVCC horizon (an idle transaction, a long
report, a `REPEATABLE READ` reader), every pending entry of a job claimed since
then stays in the claim index, dead but not removable, and an index scan from the
head visits each one (and its heap row) before the first live job: a claim then
costs O(jobs claimed since the horizon was pinned), and the queue falls behind.

So each worker process remembers, per (queue, priority), a floor: a `run_at`
below which it has already taken every job it could see, less `MARGIN` for jobs
that commit a little after their `run_at` (a submit's transaction takes
milliseconds). Claims read the index from there (`jobcore.store`'s `job_claim`).
A job can still appear below a floor: one whose transaction ran longer than the
margin (a transactional enqueue), a job handed back or recovered (it keeps its
`run_at`), a row another transaction held when the claim skipped it, a job
submitted with a `run_at` in the past. Sweeps find those: a claim without floors,
from the head of the index, run whenever the time since the last sweep is at
least `COST_RATIO` times what that sweep took (so sweeping costs at most about
1/COST_RATIO of a claimer's time), and at least every `MAX_INTERVAL`. On a table
without dead entries a sweep costs what any claim costs and nearly every claim is
one; under a held horizon they run every few seconds.

Pure bookkeeping: no I/O, times are the database's (`run_at`) and the caller's
monotonic clock (sweep pacing).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

MARGIN = timedelta(seconds=1)
COST_RATIO = 20.0
MAX_INTERVAL = 5.0


class Taken(Protocol):
    """What a floor is learned from: a job a claim took."""

    @property
    def queue(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def run_at(self) -> datetime: ...


class Sweeps:
    """When the next read from the head is due: paced by what the last one cost."""

    def __init__(self, ratio: float = COST_RATIO, max_interval: float = MAX_INTERVAL) -> None:
        self._ratio = ratio
        self._max_interval = max_interval
        self._next = float("-inf")

    def due(self, now: float) -> bool:
        return now >= self._next

    def done(self, started: float, ended: float) -> None:
        cost = max(ended - started, 0.0)
        self._next = ended + min(self._ratio * cost, self._max_interval)


class ClaimFloors:
    """Per (queue, priority), the `run_at` a claim of this process starts from."""

    def __init__(self, margin: timedelta = MARGIN, sweeps: Sweeps | None = None) -> None:
        self._margin = margin
        self._floors: dict[tuple[str, int], datetime] = {}
        self.sweeps = sweeps or Sweeps()

    def params(self, queues: Iterable[str], *, sweep: bool) -> dict[str, list[Any]]:
        """The claim's floor parameters for `queues`; none at all for a sweep."""
        wanted = set(queues)
        known = [] if sweep else [(k, f) for k, f in self._floors.items() if k[0] in wanted]
        return {
            "floor_queues": [queue for (queue, _), _ in known],
            "floor_priorities": [priority for (_, priority), _ in known],
            "floors": [floor for _, floor in known],
        }

    def learn(self, taken: Sequence[Taken], *, sweep: bool) -> None:
        """Move the floors past what a claim took. Every job of a (queue, priority) the
        claim could take below the last one it took (in claim order) it took, or another
        claim held; so the floor rises to that job's `run_at`, less the margin. After a
        sweep it may also fall: the sweep found jobs below the floor, and there may be more
        of them between what it took and the old floor."""
        latest: dict[tuple[str, int], datetime] = {}
        for job in taken:
            key = (job.queue, job.priority)
            if key not in latest or job.run_at > latest[key]:
                latest[key] = job.run_at
        for key, run_at in latest.items():
            floor = run_at - self._margin
            old = self._floors.get(key)
            self._floors[key] = floor if sweep or old is None else max(old, floor)

    def floor(self, queue: str, priority: int) -> datetime | None:
        return self._floors.get((queue, priority))
