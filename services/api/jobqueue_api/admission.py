"""Admission control (MAX_PENDING): submissions to a queue holding its cap of pending jobs
are refused (429), so a flood cannot grow the table, and every claim's index, without bound.

Pending means every `pending` row of the queue, due or scheduled: both occupy the table
and the claim index alike. No count per request: each API process keeps the depths of the
capped queues from one query (`store.pending_depths`), refreshed by the first submission
that finds them more than REFRESH seconds old, and adds the jobs it creates itself
meanwhile. So one process alone overshoots a cap only by the requests it admitted that
were still in flight when the cap was reached (a batch below the cap is admitted whole);
several processes, and jobs enqueued by other means, by what they add within REFRESH.
A queue is admitted again at most REFRESH after it drops below its cap.

A refused request writes nothing. A request to a full queue is admitted only when every
one of its jobs bound for a full queue carries an idempotency key that already names a
stored job: such a request creates nothing (a replay, or a 409 conflict), so it is
answered as it would be without the cap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import store
from jobcore.settings import Settings
from jobqueue_api.database import in_turn

# How old the depths may be. Also the Retry-After of a refusal: by then they are fresh.
REFRESH = 1.0


class Admission:
    """The caps of one API process and its view of the capped queues' depths."""

    def __init__(self, caps: dict[str, int], others: int | None) -> None:
        self._caps = caps
        self._others = others
        self._pending: dict[str, int] = {}
        # Jobs this process created since the depths were last read.
        self._created: dict[str, int] = {}
        # When the last read started, successful or not.
        self._read_at = float("-inf")
        self._first_read = asyncio.Event()

    @classmethod
    def of(cls, settings: Settings) -> Admission | None:
        """The admission control MAX_PENDING asks for; None when it is not set."""
        caps, others = settings.pending_caps
        return cls(caps, others) if caps or others is not None else None

    def cap(self, queue: str) -> int | None:
        return self._caps.get(queue, self._others)

    def _full(self, queue: str) -> bool:
        cap = self._caps.get(queue, self._others)
        if cap is None:
            return False
        return self._pending.get(queue, 0) + self._created.get(queue, 0) >= cap

    async def refused(
        self, engine: AsyncEngine, jobs: Sequence[store.NewJob], deadline: float
    ) -> str | None:
        """The first full queue that `jobs` would add to, or None: they may be submitted.

        `deadline` (event loop time) bounds the reads this takes.
        """
        if asyncio.get_running_loop().time() - self._read_at >= REFRESH:
            await self._read(engine, deadline)
        elif not self._first_read.is_set():
            async with asyncio.timeout_at(deadline):
                await self._first_read.wait()
        full = {new.queue for new in jobs if self._full(new.queue)}
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
        return None

    def created(self, queue: str, count: int = 1) -> None:
        """Count jobs this process created in `queue` until the next read of the depths."""
        self._created[queue] = self._created.get(queue, 0) + count

    async def _read(self, engine: AsyncEngine, deadline: float) -> None:
        # Marked at the start, so requests arriving meanwhile go on with the depths they
        # have instead of queueing behind this read (or, in an outage, behind one failed
        # read after another).
        self._read_at = asyncio.get_running_loop().time()
        # Jobs created from here on may be in the read too: counted twice until the next
        # read, which errs on the side of refusing.
        created, self._created = self._created, {}
        try:
            async with asyncio.timeout_at(deadline), in_turn(engine), engine.connect() as conn:
                self._pending = await store.pending_depths(conn, self._caps, self._others)
        except BaseException:
            for queue, count in created.items():
                self.created(queue, count)
            raise
        finally:
            self._first_read.set()
