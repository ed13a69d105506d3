"""Claim floors: where a worker's claims start reading the claim index, and when they
read it from the head instead (a sweep); and count floors, the same for the periodic
counts (`CountFloors`, below).

While something holds PostgreSQL's MVCC horizon (an idle transaction, a long
report, a `REPEATABLE READ` reader), every pending entry of a job claimed since
then stays in the claim index, dead but not removable, and an index scan from the
head visits each one (and its heap row) before the first live job: a claim then
costs O(jobs claimed since the horizon was pinned), and the queue falls behind.

So each worker process remembers, per (queue, priority), a floor for the key-less
jobs: a `run_at` below which it has already taken every job it could see, less
`MARGIN` for jobs that commit a little after their `run_at` (a submit's
transaction takes milliseconds). Claims read the index from there
(`jobcore.queries`' `JOB_CLAIM`). And per (queue, priority, concurrency key), the
same for the keys it served last (`KNOWN_KEYS` of them): keys take turns, but
within a key the claim goes in `run_at` order too. Those are sent only while the
checks of the heads (below) read past dead entries to find the heads (a held
horizon): a claim steps through each known key it passes, where from the head it
steps only through keys with jobs.

A job can still appear below a floor: one whose transaction ran longer than the
margin (a transactional enqueue), a job handed back or recovered (it keeps its
`run_at`), a row another transaction held when the claim skipped it, a job
submitted with a `run_at` in the past. Two reads from the head of the index find
those:

- a sweep, a claim without floors, while reading from the head is cheap (at most
  `CHEAP`, as on a table without dead entries) and the time since the last one is
  at least `COST_RATIO` times what it took: then nearly every claim is one, and a
  late job waits for nothing;
- a check of the heads (`jobcore.queries.JOB_CLAIM_HEADS`, the earliest due job per
  queue and priority, locking nothing), every `check_interval(cost)` seconds off
  the claims' path, which lowers a floor that a due job lies below. Under a held
  horizon reading from the head costs tens of ms or more: claims then never sweep,
  and a late job waits for the next check, at most `MAX_INTERVAL`.

Pure bookkeeping: no I/O, times are the database's (`run_at`) and the caller's
monotonic clock (sweep pacing).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, Protocol

MARGIN = timedelta(seconds=1)
COST_RATIO = 20.0
MAX_INTERVAL = 5.0
CHEAP = 0.005
MIN_CHECK_INTERVAL = 1.0


class Position(Protocol):
    """Where a job stands in claim order: a job a claim took, or one a check of the heads
    found (a queue's earliest due job at one priority, and one key's)."""

    @property
    def queue(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def run_at(self) -> datetime: ...


class KeyPosition(Position, Protocol):
    @property
    def concurrency_key(self) -> str | None: ...


# The keys a process keeps floors for, the ones it served last: a claim steps through each
# it passes in turn order, with jobs or not.
KNOWN_KEYS = 256
NO_KEYS: dict[str, list[Any]] = {
    "key_floor_queues": [],
    "key_floor_priorities": [],
    "key_floor_keys": [],
    "key_floors": [],
}


# Claim index entries a check of the heads may read per head (and per key it looks for)
# before the keys' floors are worth sending: from the head, each probe lands on the first
# live entry at once, bar a few a claim has just taken.
DEAD_PER_HEAD = 10

# A check of the heads reads each known key's head too: on a table without dead entries
# about 10-20 µs a key, a few ms for `KNOWN_KEYS`. Whether reading from the head is costly
# is judged on what it cost per this many keys (at least the cost of one).
KEYS_PER_CHECK = 100


def check_cost(cost: float, keys: int) -> float:
    """What a check of the heads that read `keys` keys' heads and took `cost` seconds
    says a read from the head costs."""
    return cost * KEYS_PER_CHECK / max(KEYS_PER_CHECK, keys)


def check_interval(cost: float) -> float:
    """Seconds until the next check of the heads, after one that took `cost` seconds."""
    return min(max(COST_RATIO * cost, MIN_CHECK_INTERVAL), MAX_INTERVAL)


class Sweeps:
    """Whether a claim reads from the head: while that is cheap, paced by what it cost;
    when it is not, only if no read from the head (a check's) happened for twice
    `max_interval` (nothing checks the heads)."""

    def __init__(
        self, ratio: float = COST_RATIO, max_interval: float = MAX_INTERVAL, cheap: float = CHEAP
    ) -> None:
        self._ratio = ratio
        self._max_interval = max_interval
        self._cheap = cheap
        self._next = float("-inf")
        self._last = float("-inf")
        self.cost = 0.0  # what the last read from the head took, a sweep's or a check's

    def due(self, now: float) -> bool:
        if self.cost <= self._cheap:
            return now >= self._next
        return now >= self._last + 2 * self._max_interval

    def done(self, started: float, ended: float) -> None:
        self.measured(ended - started, ended)
        self._next = ended + min(self._ratio * self.cost, self._max_interval)

    def measured(self, cost: float, at: float) -> None:
        self.cost = max(cost, 0.0)
        self._last = at


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def micros(at: datetime) -> int:
    """`at` as microseconds since the epoch, exactly: how a claim is sent its floors (an
    array of timestamptz costs the driver a few µs an element to encode, a claim knowing
    hundreds of priorities a millisecond)."""
    return (at - EPOCH) // _MICROSECOND


class ClaimFloors:
    """Per (queue, priority), the `run_at` a claim of this process starts from."""

    def __init__(self, margin: timedelta = MARGIN, sweeps: Sweeps | None = None) -> None:
        self._margin = margin
        self._floors: dict[tuple[str, int], datetime] = {}
        self._sent: dict[tuple[str, int], int] = {}  # the same, as `micros`
        # Per (queue, priority, key), as `micros`; the key served last comes last.
        self._keys: dict[tuple[str, int, str], int] = {}
        self._key_leases: int | None = None  # below every running job's lease, with a key
        self._dead_heads = False  # whether the last check of the heads read past dead entries
        # Checks of the heads run while claims do: per floor, the last check that lowered it
        # (`generation` counts them), so a claim that read its floors before does not raise
        # it again past the job the check found.
        self.generation = 0
        self._lowered: dict[tuple[str, int] | tuple[str, int, str], int] = {}
        self.sweeps = sweeps or Sweeps()

    def params(self, queues: Iterable[str], *, sweep: bool) -> dict[str, Any]:
        """The claim's floor parameters for `queues` (the floors as `micros`); none at all
        for a sweep, and the keys' only while the checks of the heads read past dead
        entries (`checked`). The key
        lease floor, which only makes KEY_CONCURRENCY's count cheaper, goes with every
        claim."""
        wanted = set(queues)
        known: list[tuple[tuple[str, int], int | None]] = []
        keys = NO_KEYS
        if not sweep:
            known += [(k, f) for k, f in self._sent.items() if k[0] in wanted]
            if self._dead_heads:
                keys = self.keys(wanted)
                # The keys' priorities are known too, their key-less jobs read from the head
                # (a floor of None): a priority found by a probe would be read from its head.
                known += [
                    (place, None)
                    for place in dict.fromkeys(
                        zip(keys["key_floor_queues"], keys["key_floor_priorities"], strict=True)
                    )
                    if place not in self._sent
                ]
        return {
            "floor_queues": [queue for (queue, _), _ in known],
            "floor_priorities": [priority for (_, priority), _ in known],
            "floors": [floor for _, floor in known],
            **keys,
            "key_lease_floor": self._key_leases,
        }

    @property
    def key_leases(self) -> int | None:
        """The key lease floor, as `micros` (None: not learnt yet)."""
        return self._key_leases

    def learn_key_leases(self, first: datetime) -> None:
        """Set the key lease floor `LEASE_MARGIN` below `first`, the earliest lease among
        the running jobs with a key (or the time, if none ran), read from the head. A lease
        only moves forward (a claim sets it to its transaction's now() and the lease's
        length, a heartbeat extends it), and one that ran out stays until recovery takes
        the job back; a claim the read did not see began at most the limits on a worker's
        session before it (a statement's, a lock's and an idle transaction's time).
        So every running job's lease lies above the floor, from then on."""
        self._key_leases = micros(first - LEASE_MARGIN)

    def checked(self, cost: float, at: float, *, keys: int, heads: int, entries: int) -> None:
        """Take in a check of the heads that read `keys` keys' heads and found `heads`,
        reading `entries` claim index entries in `cost` seconds, ending at `at`: the cost
        paces the sweeps (`check_cost`), and the entries it read per head say whether
        claims send the keys' floors (more than `DEAD_PER_HEAD`: a held horizon keeps dead
        entries before the heads). Neither a claim's cost nor the check's says that: on a
        busy machine a read from the head of a table without dead entries takes
        milliseconds too, where the walk over known keys would only cost more."""
        self.sweeps.measured(check_cost(cost, keys), at)
        self._dead_heads = entries > DEAD_PER_HEAD * (heads + keys + 1)

    def keys(self, queues: Iterable[str]) -> dict[str, list[Any]]:
        """The known keys of `queues` and their floors, as parameters."""
        wanted = set(queues)
        known = [(k, f) for k, f in self._keys.items() if k[0] in wanted]
        return {
            "key_floor_queues": [queue for (queue, _, _), _ in known],
            "key_floor_priorities": [priority for (_, priority, _), _ in known],
            "key_floor_keys": [key for (_, _, key), _ in known],
            "key_floors": [floor for _, floor in known],
        }

    def _lowered_since(
        self, place: tuple[str, int] | tuple[str, int, str], since: int | None
    ) -> bool:
        """Whether a check lowered the floor at `place` after generation `since` (when the
        claim learning now read its floors; None: unknown, taken as no)."""
        return since is not None and self._lowered.get(place, 0) > since

    def learn_keys(
        self, taken: Sequence[KeyPosition], *, sweep: bool, since: int | None = None
    ) -> None:
        """Move the floors of the keys a claim took jobs of past the last one it took of
        each (as `learn` for the key-less jobs, a sweep's may fall, and none past what a
        check found since `since`), and forget the keys served longest ago beyond
        `KNOWN_KEYS`."""
        latest: dict[tuple[str, int, str], datetime] = {}
        for job in taken:
            if job.concurrency_key is None:
                continue
            key = (job.queue, job.priority, job.concurrency_key)
            if key not in latest or job.run_at > latest[key]:
                latest[key] = job.run_at
        for key, run_at in latest.items():
            floor = micros(run_at - self._margin)
            old = self._keys.pop(key, None)
            if old is not None and self._lowered_since(key, since):
                self._keys[key] = min(old, floor)
            else:
                self._keys[key] = floor if sweep or old is None else max(old, floor)
        while len(self._keys) > KNOWN_KEYS:
            oldest = next(iter(self._keys))
            del self._keys[oldest]
            self._lowered.pop(oldest, None)

    def _set(self, key: tuple[str, int], floor: datetime) -> None:
        if self._floors.get(key) != floor:
            self._floors[key] = floor
            self._sent[key] = micros(floor)

    def learn(self, taken: Sequence[Position], *, sweep: bool, since: int | None = None) -> None:
        """Move the floors past what a claim took (that read its floors at generation
        `since`: a floor a check lowered after that is not raised). Every job of a (queue,
        priority) the claim could take below the last one it took (in claim order) it took,
        or another claim held; so the floor rises to that job's `run_at`, less the margin.
        After a sweep it may also fall: the sweep found jobs below the floor, and there may
        be more of them between what it took and the old floor.

        A sweep also forgets, in each queue it took from, the floors above the highest
        priority it took from there: it read those priorities from the head and found
        nothing to take. A claim walks every priority it has a floor for, so without this a
        queue whose priorities drained one by one would cost every claim a step through each
        of them; reading them from the head again is cheap (or there would have been no
        sweep). Where it took nothing (an empty queue, for a moment) the floors stay: the
        claims after it would otherwise read from the head until they took a job."""
        latest: dict[tuple[str, int], datetime] = {}
        for job in taken:
            key = (job.queue, job.priority)
            if key not in latest or job.run_at > latest[key]:
                latest[key] = job.run_at
        if sweep:
            top: dict[str, int] = {}
            for queue, priority in latest:
                top[queue] = max(top.get(queue, priority), priority)
            for queue, priority in list(self._floors):
                if queue in top and priority > top[queue]:
                    del self._floors[(queue, priority)], self._sent[(queue, priority)]
                    self._lowered.pop((queue, priority), None)
        for key, run_at in latest.items():
            floor = run_at - self._margin
            old = self._floors.get(key)
            if old is not None and self._lowered_since(key, since):
                self._set(key, min(old, floor))
            else:
                self._set(key, floor if sweep or old is None else max(old, floor))

    def lower(self, heads: Iterable[KeyPosition]) -> None:
        """Lower each floor that a due job lies below to that job's `run_at` (a check of
        the heads found it); a priority without a floor gets one there (a key without one
        stays unknown)."""
        self.generation += 1
        for head in heads:
            if head.concurrency_key is not None:
                place = (head.queue, head.priority, head.concurrency_key)
                if place in self._keys and micros(head.run_at) < self._keys[place]:
                    self._keys[place] = micros(head.run_at)
                    self._lowered[place] = self.generation
                continue
            key = (head.queue, head.priority)
            old = self._floors.get(key)
            if old is None or head.run_at < old:
                self._set(key, head.run_at)
                self._lowered[key] = self.generation

    def floor(self, queue: str, priority: int) -> datetime | None:
        return self._floors.get((queue, priority))

    def key_floor(self, queue: str, priority: int, key: str) -> int | None:
        return self._keys.get((queue, priority, key))


# --- count floors -------------------------------------------------------------------------
#
# The periodic counts (the queue gauges, admission's pending depths) read the same indexes
# from the head, and under a held horizon each would cost O(dead entries) like a claim
# from the head. So each reader remembers, from its last count, the queues it found, per
# (queue, priority) the earliest pending `run_at` (or the count's time, where none was
# pending), and the earliest lease of the running jobs; its next count reads from there,
# less `MARGIN`, and probes only the gaps between the queues and priorities it knows.
# A job can appear below those floors as below a claim's (one handed back or recovered
# keeps its `run_at`; a transaction that committed late): sweeps, counts from the head,
# find it, every round while they are cheap and at most `COUNT_SWEEP_INTERVAL` apart.
# Until a sweep, a queue that emptied is still reported, with nothing in it.
COUNT_SWEEP_INTERVAL = 30.0


@dataclass(frozen=True)
class Counted:
    """Where a count found a queue's first live jobs, in `micros`: per priority it read
    (`priorities`, highest first), the earliest pending `run_at` or, where none was
    pending, the count's time (`firsts`); the earliest lease of its running jobs or the
    count's time (`running`; None: not counted)."""

    queue: str
    priorities: Sequence[int]
    firsts: Sequence[int]
    running: int | None = None


class CountFloors:
    """Where one reader's periodic counts start: the queues, pending floors and lease floor
    of the `Counted` it learnt, and when it sweeps (`sweeps`)."""

    def __init__(self, margin: timedelta = MARGIN, sweeps: Sweeps | None = None) -> None:
        self._margin = margin // _MICROSECOND
        self._queues: set[str] = set()
        self._pending: dict[tuple[str, int], int] = {}
        self._lease: int | None = None
        self.sweeps = sweeps or Sweeps(COST_RATIO, COUNT_SWEEP_INTERVAL, cheap=float("inf"))

    def params(self, *, sweep: bool, leases: bool = True) -> dict[str, Any]:
        """The count's parameters (with `leases`, the lease floor's too): none for a sweep,
        which reads from the head."""
        known = [] if sweep else sorted(self._pending.items())
        found: dict[str, Any] = {
            "known_queues": [] if sweep else sorted(self._queues),
            "floor_queues": [queue for (queue, _), _ in known],
            "floor_priorities": [priority for (_, priority), _ in known],
            "floors": [floor for _, floor in known],
        }
        if leases:
            found["lease_floor"] = None if sweep else self._lease
        return found

    def learn(self, counted: Iterable[Counted], *, sweep: bool) -> None:
        """Take in what a count found. After a sweep the floors are what it found, and
        nothing else (queues and priorities that emptied are forgotten); after another
        count they only rise, and what it found in the gaps is added."""
        if sweep:
            self._queues.clear()
            self._pending.clear()
            self._lease = None
        lease: int | None = None
        for found in counted:
            self._queues.add(found.queue)
            for priority, first in zip(found.priorities, found.firsts, strict=True):
                key = (found.queue, priority)
                self._pending[key] = max(
                    self._pending.get(key, first - self._margin), first - self._margin
                )
            if found.running is not None:
                lease = found.running if lease is None else min(lease, found.running)
        if lease is not None:
            floor = lease - self._margin
            self._lease = floor if self._lease is None else max(self._lease, floor)


# --- the limited types' floors -----------------------------------------------------------
#
# The claim under per-type limits (`JOB_CLAIM_LIMITED`) reads each limited type's due jobs
# from its own index (`jobs_claim_type_idx`) and counts its running jobs through the lease
# index: from the head, both would visit every dead entry a held horizon keeps. Its
# floors are a claim's, per type, and a lease floor per type. TYPE_CONCURRENCY is a
# guarantee, so the lease floor must lie below every running job of the type: a lease only
# moves forward (a claim sets it to its transaction's now() and the lease's length, a
# heartbeat extends it), one that ran out stays until recovery takes the job back, and the
# count sees every claim committed before the type's lock. A claim the count did not see
# began before it, at most the limits on a worker's session earlier (a statement's, a lock's
# and an idle transaction's time, 11 s); `LEASE_MARGIN` is well past that.
LEASE_MARGIN = timedelta(seconds=30)


class Taken(Position, Protocol):
    @property
    def type(self) -> str: ...


class TypeFloors:
    """Per limited type, its claim floors (per queue and priority, as `ClaimFloors`) and
    its lease floor; and when the limited claim sweeps (`sweeps`: by its cost, at most
    `COUNT_SWEEP_INTERVAL` apart)."""

    def __init__(self, types: Iterable[str], margin: timedelta = MARGIN) -> None:
        self._claims = {name: ClaimFloors(margin) for name in types}
        self._generation = 0
        self._leases: dict[str, int] = {}
        self._lease_margin = LEASE_MARGIN // _MICROSECOND
        self.sweeps = Sweeps(COST_RATIO, COUNT_SWEEP_INTERVAL, cheap=float("inf"))

    def params(self, queues: Iterable[str], *, sweep: bool) -> dict[str, list[Any]]:
        """The limited claim's floor parameters: the claim floors of `queues` (a queue with
        KEY_CONCURRENCY is read from the head: a job of a full key is left below what the
        claim took) and the lease floors; none for a sweep."""
        wanted = list(queues)
        found: dict[str, list[Any]] = {
            "type_floor_types": [],
            "type_floor_queues": [],
            "type_floor_priorities": [],
            "type_floors": [],
        }
        for name, claims in self._claims.items():
            sent = claims.params(wanted, sweep=sweep)
            found["type_floor_types"] += [name] * len(sent["floors"])
            found["type_floor_queues"] += sent["floor_queues"]
            found["type_floor_priorities"] += sent["floor_priorities"]
            found["type_floors"] += sent["floors"]
        found["lease_floors"] = [None if sweep else self._leases.get(name) for name in self._claims]
        return found

    @property
    def generation(self) -> int:
        """The checks that lowered floors so far (as `ClaimFloors.generation`: each type's
        claim floors are lowered by every check)."""
        return self._generation

    def learn(
        self,
        taken: Sequence[Taken],
        running: dict[str, int],
        *,
        sweep: bool,
        since: int | None = None,
    ) -> None:
        """Move the claim floors past what a claim took (as `ClaimFloors.learn`, the
        claim having read them at generation `since`), and the lease floors up to the
        earliest lease `running` names per type (a sweep's may fall), less `LEASE_MARGIN`."""
        for name, claims in self._claims.items():
            claims.learn([job for job in taken if job.type == name], sweep=sweep, since=since)
        for name, first in running.items():
            floor = first - self._lease_margin
            old = self._leases.get(name)
            self._leases[name] = floor if sweep or old is None else max(old, floor)

    def lower(self, heads: Iterable[Position]) -> None:
        """Lower each claim floor a due job lies below (a check of the heads found it,
        whatever its type, and whatever its key: the limited claim reads a queue without
        KEY_CONCURRENCY in `run_at` order, keys or not; so its floors may be lower than
        need be, never higher). Only floors that are set: a priority without one is read
        from its head."""
        found = [_At(h.queue, h.priority, h.run_at) for h in heads]
        self._generation += 1
        for claims in self._claims.values():
            claims.lower([h for h in found if claims.floor(h.queue, h.priority) is not None])


class _At(NamedTuple):
    queue: str
    priority: int
    run_at: datetime
    concurrency_key: str | None = None
