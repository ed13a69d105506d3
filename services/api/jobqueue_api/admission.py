"""Admission control (MAX_PENDING): submissions to a queue holding its cap of pending jobs
are refused (429), so a flood cannot grow the table, and every claim's index, without bound.

Pending means every `pending` row of the queue, due or scheduled: both occupy the table
and the claim index alike. No count per request: each API process keeps the depths of the
capped queues from one query (`store.pending_depths`), refreshed by the first submission
that finds them more than REFRESH seconds old, and adds what it admits itself meanwhile: a
request takes its jobs' places when it is admitted (a `Reservation`), before its insert,
and gives back those it did not create when it is answered. So one process overshoots a
cap by one request at most (a batch admitted below the cap is admitted whole), however
many it has in flight; while the depths are re-read, the old ones and everything created
since still count. Several API processes, and jobs enqueued by other means, each add what
they create within REFRESH: the cap is a bound per process plus that.
A queue is admitted again at most REFRESH after it drops below its cap.

A refused request writes nothing. A request to a full queue is admitted only when every
one of its jobs bound for a full queue carries an idempotency key that already names a
stored job: such a request creates nothing (a replay, or a 409 conflict), so it is
answered as it would be without the cap.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import store
from jobcore.floors import CountFloors
from jobcore.rows import NewJob
from jobcore.settings import ApiSettings
from jobqueue_api.database import in_turn

# How old the depths may be. Also the Retry-After of a refusal: by then they are fresh.
REFRESH = 1.0


class Reservation:
    """The places an admitted request holds in its capped queues until `done`."""

    def __init__(self, admission: Admission, held: Counter[str]) -> None:
        self._admission = admission
        self._held = held

    def done(self, created: Iterable[str] = ()) -> None:
        """The request was answered, having created a job in each of `created` (a queue
        per job); every other place is given back. Call once, also when it failed."""
        held, self._held = self._held, Counter()
        self._admission._settle(held, Counter(q for q in created if q in held))


class Admission:
    """The caps of one API process and its view of the capped queues' depths."""

    def __init__(self, caps: dict[str, int], others: int | None) -> None:
        self._caps = caps
        self._others = others
        self._pending: dict[str, int] = {}
        # Jobs this process created since the read that gave `_pending` started.
        self._created: Counter[str] = Counter()
        # Places held by requests admitted and not yet answered.
        self._reserved: Counter[str] = Counter()
        # Per read in progress: the jobs created since it started (its `_created` to be).
        self._reads: list[Counter[str]] = []
        self._applied = 0  # the sequence number of the read `_pending` comes from
        self._sequence = 0
        # When the last read started, successful or not.
        self._read_at = float("-inf")
        self._first_read = asyncio.Event()
        # Where the reads start between sweeps (`jobcore.floors.CountFloors`): under a held
        # MVCC horizon a read from the head visits every dead entry the claims left.
        self.floors = CountFloors()
        self._sweeping = False

    @classmethod
    def of(cls, settings: ApiSettings) -> Admission | None:
        """The admission control MAX_PENDING asks for; None when it is not set."""
        caps, others = settings.max_pending
        return cls(caps, others) if caps or others is not None else None

    def cap(self, queue: str) -> int | None:
        return self._caps.get(queue, self._others)

    def _full(self, queue: str) -> bool:
        cap = self.cap(queue)
        if cap is None:
            return False
        held = self._pending.get(queue, 0) + self._created[queue] + self._reserved[queue]
        return held >= cap

    async def admit(
        self, engine: AsyncEngine, jobs: Sequence[NewJob], deadline: float
    ) -> Reservation | str:
        """The first full queue that `jobs` would add to, or their `Reservation`: they may
        be submitted, and hold their places until it is `done`.

        `deadline` (event loop time) bounds the reads this takes.
        """
        if asyncio.get_running_loop().time() - self._read_at >= REFRESH:
            await self._read(engine, deadline)
        elif not self._first_read.is_set():
            async with asyncio.timeout_at(deadline):
                await self._first_read.wait()
        excused: set[str] = set()
        while True:
            refused = await self._refused(engine, jobs, deadline, excused)
            if refused is not None:
                return refused
            # Checked again after the await for stored keys: another request may have taken
            # the last places of a queue that had room. No await between this check and the
            # reservation below: no other request of this process can take the same places.
            if not any(self._full(new.queue) for new in jobs if new.queue not in excused):
                break
        held = Counter(new.queue for new in jobs if self.cap(new.queue) is not None)
        self._reserved.update(held)
        return Reservation(self, held)

    async def _refused(
        self, engine: AsyncEngine, jobs: Sequence[NewJob], deadline: float, excused: set[str]
    ) -> str | None:
        """The first full queue `jobs` add to, unless every one of its jobs replays a stored
        job; queues found full but excused so are added to `excused`."""
        full = {new.queue for new in jobs if self._full(new.queue)} - excused
        if not full:
            return None
        bound = [new for new in jobs if new.queue in full]
        keys: set[str] = set()
        for new in bound:
            if new.idempotency_key is None:
                return new.queue
            keys.add(new.idempotency_key)
        async with asyncio.timeout_at(deadline), in_turn(engine), engine.connect() as conn:
            stored = await store.existing_keys(conn, keys)
        for new in bound:
            if new.idempotency_key not in stored:
                return new.queue
        excused.update(full)
        return None

    def _settle(self, held: Counter[str], created: Counter[str]) -> None:
        self._reserved.subtract(held)
        self._created.update(created)
        for since in self._reads:
            since.update(created)

    async def _read(self, engine: AsyncEngine, deadline: float) -> None:
        # Marked at the start, so requests arriving meanwhile go on with the depths they
        # have instead of queueing behind this read (or, in an outage, behind one failed
        # read after another).
        loop = asyncio.get_running_loop()
        started = self._read_at = loop.time()
        # One sweep at a time: reads overlap while one is slow (under a held horizon).
        sweep = not self._sweeping and self.floors.sweeps.due(started)
        self._sweeping |= sweep
        self._sequence += 1
        sequence = self._sequence
        # Jobs created from here on may be in the read too: counted twice until the next
        # read, which errs on the side of refusing. Until it returns, the depths it replaces
        # and what was created since they were read still count.
        since: Counter[str] = Counter()
        self._reads.append(since)
        try:
            async with asyncio.timeout_at(deadline), in_turn(engine), engine.connect() as conn:
                pending, counted = await store.pending_depths(
                    conn, self._caps, self._others, self.floors, sweep
                )
            if sequence > self._applied:  # a slower, older read must not undo a newer one
                self._pending, self._created, self._applied = pending, since, sequence
                # Nor its floors: a sweep's may have fallen below those of an older read.
                self.floors.learn(counted, sweep=sweep)
        finally:
            if sweep:  # one that failed too: the reads after it go on from the floors
                self.floors.sweeps.done(started, loop.time())
                self._sweeping = False
            # By identity: Counters with the same counts are equal.
            self._reads = [other for other in self._reads if other is not since]
            self._first_read.set()
