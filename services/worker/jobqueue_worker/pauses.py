"""Which of this process's queues are paused (docs/worker.md#pausing-a-queue): the dispatcher
and the completer's claims skip them.

Re-read from the database every `jobcore.pauses.PAUSE_POLL` seconds, and at once when the
listener hears a pause or a resume (`jobcore.pauses.PAUSE_CHANNEL`) or reconnects. A queue
resumed wakes the dispatcher, so its due jobs start without waiting for a poll. While the
database cannot be read, the queues stay as last read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from jobcore.backoff import Retry
from jobcore.pauses import PAUSE_POLL
from jobqueue_worker.loops import Loop

log = logging.getLogger("jobqueue.worker")


class PauseStore(Protocol):
    async def paused_queues(self) -> frozenset[str]: ...


class PausedQueues(Loop):
    """`paused`: the queues of `queues` that are paused, as last read."""

    name = "paused_queues"

    def __init__(
        self,
        store: PauseStore,
        queues: Iterable[str],
        resumed: Callable[[], None],
        interval: float = PAUSE_POLL,
    ) -> None:
        super().__init__(interval, Retry(0.25, 5.0))
        self._store = store
        self._queues = frozenset(queues)
        self._resumed = resumed
        self.paused: frozenset[str] = frozenset()

    async def run_once(self) -> frozenset[str]:
        paused = await self._store.paused_queues() & self._queues
        before, self.paused = self.paused, paused
        for queue in sorted(paused - before):
            log.info("queue paused: claiming nothing from it", extra={"queue": queue})
        if before - paused:
            for queue in sorted(before - paused):
                log.info("queue resumed", extra={"queue": queue})
            self._resumed()
        return paused
