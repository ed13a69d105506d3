"""Key turns: per (queue, priority), the concurrency key a worker process's claims served
last, so that its next claim there starts with the key after it (fair dispatch: keys take
turns, `jobcore.queries.job_claim`).

Keys are compared in byte order, as the claim index orders them (`COLLATE "C"`): Python's
order of `str` is that of their code points, which is UTF-8's byte order. The key-less
jobs are key ''. Pure bookkeeping: no I/O. And which claims need keys at all
(`KeyedQueues`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol


class Keyed(Protocol):
    """A job a claim took, where it stood in claim order."""

    @property
    def queue(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def concurrency_key(self) -> str | None: ...


class KeyTurns:
    """Per (queue, priority), the key served last."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, int], str] = {}

    def params(self, queues: Iterable[str]) -> dict[str, list[Any]]:
        """The claim's turn parameters for `queues`."""
        wanted = set(queues)
        known = [(place, key) for place, key in self._last.items() if place[0] in wanted]
        return {
            "turn_queues": [queue for (queue, _), _ in known],
            "turn_priorities": [priority for (_, priority), _ in known],
            "turns": [key for _, key in known],
        }

    def learn(self, taken: Sequence[Keyed]) -> None:
        """After a claim: per (queue, priority) it took jobs at, the last key it served. It
        served the keys after the last turn's in order, then, if slots were left, from the
        first key round to that one: the last is the greatest key up to the last turn's if
        it went round, else the greatest it served."""
        keys: dict[tuple[str, int], set[str]] = {}
        for job in taken:
            keys.setdefault((job.queue, job.priority), set()).add(job.concurrency_key or "")
        for place, served in keys.items():
            last = self._last.get(place)
            round_again = [key for key in served if last is not None and key <= last]
            self._last[place] = max(round_again or served)

    def last(self, queue: str, priority: int) -> str | None:
        return self._last.get((queue, priority))


# A queue whose claims took a job with a key is claimed with keys in turn this long after.
KEYED_FOR = 60.0
# And every this often, a claim is one with keys in turn anyway: it finds keyed jobs the plain
# claims would reach only in claim order (behind a backlog of key-less ones).
KEYED_PROBE = 1.0


class KeyedQueues:
    """Which claims need keys in turn. The plain claim (claim order alone) plans and runs
    in about a third of the time, and is exact for a queue where no key has jobs; a process
    uses it (where KEY_CONCURRENCY does not apply) unless one of the queues claimed from
    took a keyed job within KEYED_FOR, or a probe is due (every KEYED_PROBE): so a key
    submitted behind a key-less backlog gets its turn within about KEYED_PROBE. Pure
    bookkeeping: no I/O."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[str, float] = {}
        self._probed = float("-inf")

    def plain(self, queues: Iterable[str]) -> bool:
        """Whether a claim of `queues` may be the plain one; a False answer to a due probe
        counts as the probe."""
        now = self._clock()
        if now - self._probed >= KEYED_PROBE:
            self._probed = now
            return False
        return not any(now - self._seen.get(q, float("-inf")) < KEYED_FOR for q in queues)

    def learn(self, taken: Sequence[Keyed]) -> None:
        now = self._clock()
        for job in taken:
            if job.concurrency_key is not None:
                self._seen[job.queue] = now
