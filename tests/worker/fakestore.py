"""An in-memory `JobStore` for unit tests of the dispatcher, executor and completer.

It follows the transitions of `jobcore.states.Operation` and fences outcome writes by
lease token like
the real store, records every call, and can be switched `down` to behave like
an unreachable database. It is the only fake store the project allows.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from jobcore.floors import CountFloors
from jobcore.maintenance import PRUNE_BATCH
from jobcore.rows import (
    CLAIMED_FIELDS,
    Claimed,
    Lease,
    LimitedClaim,
    Moved,
    Renewed,
    TableStats,
    TypeLimits,
)
from jobcore.schema import ERRORS_KEPT
from jobcore.search import QueueDepth
from jobcore.states import FINISHED, Operation, Status, out_of_attempts, unhandled_delay


@dataclass
class FakeJob:
    id: UUID
    type: str
    payload: Any
    max_attempts: int
    status: Status = Status.PENDING
    attempts: int = 0
    lease_token: int = 0
    run_at: float = 0.0
    locked_until: float | None = None
    last_error: str | None = None
    delay: float | None = None
    queue: str = "default"
    priority: int = 0
    timeout: float | None = None
    concurrency_key: str | None = None  # as `jobs.concurrency_key`
    result: str | None = None  # JSON text, as the handler's return value was encoded
    cancel_requested: bool = False
    locked: bool = False  # another transaction holds its row: renewals skip it
    finished_at: float | None = None  # on the fake's clock
    created_at: float = 0.0  # on the fake's clock (retention counts from both)
    traceparent: str | None = None  # the submitting span's context, when tracing was on
    # The failed attempts, oldest first, the last ERRORS_KEPT: {"attempt", "at" (on the
    # fake's clock), "error", "traceback"}, as `jobs.errors` holds them.
    errors: list[dict[str, Any]] = field(default_factory=list)

    def failed(self, error: str, traceback: str | None, at: float) -> None:
        """The attempt under way failed: `jobcore.queries.common.errors_appended`."""
        entry = {"attempt": self.attempts, "at": at, "error": error, "traceback": traceback}
        self.errors = [*self.errors, entry][-ERRORS_KEPT:]


class DatabaseDown(ConnectionError):
    pass


class FakeStore:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, limits: TypeLimits | None = None
    ) -> None:
        self.clock = clock
        self.limits = limits or TypeLimits()
        self.jobs: dict[UUID, FakeJob] = {}
        self.leads: dict[str, tuple[UUID, float]] = {}  # task -> (holder, until)
        self.vacuumed: list[str] = []
        self.paused: set[str] = set()  # the paused queues (`paused_queues`)
        self._windows: dict[str, tuple[float, int]] = {}  # type -> (window start, started)
        self.claims: list[int] = []  # n asked for by each claim
        self.writes: list[tuple[str, int]] = []  # (operation, batch size) of each outcome write
        self.combined: list[tuple[int, int]] = []  # (completions, n) of each complete_and_claim
        self.renewals: list[int] = []  # leases in each renew call
        self.down = False
        self.failed_calls = 0
        self.on_claim: Callable[[int], None] = lambda n: None
        self.write_gate: asyncio.Event | None = None  # when set up, writes wait for it
        self._order = itertools.count()

    def add(self, type: str, payload: Any = None, max_attempts: int = 3, **fields: Any) -> UUID:
        """A pending job; `fields` as FakeJob's (queue, priority, run_at, timeout,
        concurrency_key, traceparent)."""
        job_id = uuid.UUID(int=next(self._order) + 1)
        payload = {} if payload is None else payload
        fields.setdefault("created_at", self.clock())
        self.jobs[job_id] = FakeJob(job_id, type, payload, max_attempts, **fields)
        return job_id

    def status(self, job_id: UUID) -> Status:
        return self.jobs[job_id].status

    def request_cancel(self, job_id: UUID) -> None:
        """An operator asked to cancel the running job (`jobcore.control.cancel`): noted on
        the job only, as the real store does; the holder hears of it when the test says so."""
        job = self.jobs[job_id]
        assert job.status is Status.PROCESSING, job
        job.cancel_requested = True

    def _check(self) -> None:
        if self.down:
            self.failed_calls += 1
            raise DatabaseDown("connection refused")

    async def claim(self, slots: Mapping[str, int], lease_seconds: float) -> list[Claimed]:
        n = sum(slots.values())
        # on_claim sees the caller's state when it asked, before the round trip yields.
        self.on_claim(n)
        await asyncio.sleep(0)  # a round trip yields to the loop
        self._check()
        self.claims.append(n)
        return self._claim_now(slots, lease_seconds)

    async def next_due(self, queues: Sequence[str]) -> float | None:
        await asyncio.sleep(0)
        self._check()
        now = self.clock()
        later = [
            j.run_at - now
            for j in self.jobs.values()
            if j.status is Status.PENDING and j.queue in queues and j.run_at > now
        ]
        return min(later) if later else None

    def _claim_now(
        self,
        slots: Mapping[str, int],
        lease_seconds: float,
        room: Mapping[str, int] | None = None,
    ) -> list[Claimed]:
        """Claim order across every queue's due jobs. `room`: a limited claim, taking at most
        that many jobs of each limited type; None: the ordinary claims, which skip them."""
        now = self.clock()
        left = dict(room) if room is not None else {}
        limited = set(self.limits.types)
        # Claim order; a limited claim ranks its limited types first among equal priorities.
        due = sorted(
            (j for j in self.jobs.values() if j.status is Status.PENDING and j.run_at <= now),
            key=lambda j: (-j.priority, room is None or j.type not in limited, j.run_at, j.id),
        )
        taken = []
        for queue, n in slots.items():
            for job in (j for j in due if j.queue == queue):
                if n == 0:
                    break
                if job.type in limited:
                    if room is None or left[job.type] <= 0:
                        continue
                    left[job.type] -= 1
                    taken.append(job)
                elif room is None:
                    taken.append(job)
                # A limited claim ranks the other types' jobs without taking them.
                n -= 1
        claimed = []
        for job in taken:
            job.status = Status.PROCESSING
            job.attempts += 1
            job.lease_token += 1
            job.locked_until = now + lease_seconds
            # By name, as the real store reads its rows: a column `Claimed` gains is read off
            # the job's attribute of that name.
            values = {name: getattr(job, name) for name in CLAIMED_FIELDS}
            values["run_at"] = datetime.fromtimestamp(job.run_at, UTC)
            claimed.append(Claimed(**values))
        return claimed

    async def claim_limited(
        self,
        slots: Mapping[str, int],
        lease_seconds: float,
        overruns: Mapping[str, int] | None = None,
    ) -> LimitedClaim:
        """As the real store: the limited types' jobs among each queue's first free-slots
        due jobs in claim order, within their TYPE_CONCURRENCY (less `overruns`) and
        TYPE_RATE (fixed windows on the fake's clock)."""
        await asyncio.sleep(0)
        self._check()
        now = self.clock()
        overruns = overruns or {}
        room: dict[str, int] = {}
        windows: dict[str, float] = {}
        for name in self.limits.types:
            left = 1 << 30
            if name in self.limits.concurrency:
                running = sum(
                    1
                    for j in self.jobs.values()
                    if j.type == name and j.status is Status.PROCESSING
                )
                left = self.limits.concurrency[name] - running - overruns.get(name, 0)
            if name in self.limits.rate:
                rate, period = self.limits.rate[name]
                start = (now // period) * period
                windows[name] = start + period
                begun, used = self._windows.get(name, (start, 0))
                left = min(left, rate - (used if begun == start else 0))
            room[name] = max(left, 0)
        jobs = self._claim_now(slots, lease_seconds, room)
        held: dict[str, str] = {}
        for name in self.limits.types:
            started = sum(1 for job in jobs if job.type == name)
            if name in self.limits.rate:
                start = windows[name] - self.limits.rate[name][1]
                begun, used = self._windows.get(name, (start, 0))
                self._windows[name] = (start, (used if begun == start else 0) + started)
                if self._windows[name][1] >= self.limits.rate[name][0]:
                    held[name] = "rate"
                    continue
            if name in self.limits.concurrency and room[name] - started <= 0:
                held[name] = "concurrency"
        waits = [windows[name] - now for name, why in held.items() if why == "rate"]
        return LimitedClaim(jobs, held, min(waits) if waits else None, {})

    # --- maintenance (jobqueue_worker.maintenance.MaintenanceStore) ---

    async def take_lead(self, task: str, holder: UUID, lease_seconds: float) -> bool:
        await asyncio.sleep(0)
        self._check()
        now = self.clock()
        current = self.leads.get(task)
        if current is None or current[0] == holder or current[1] <= now:
            self.leads[task] = (holder, now + lease_seconds)
            return True
        return False

    async def resign(self, task: str, holder: UUID) -> None:
        await asyncio.sleep(0)
        self._check()
        if self.leads.get(task, (None, 0.0))[0] == holder:
            del self.leads[task]

    async def paused_queues(self) -> frozenset[str]:
        await asyncio.sleep(0)
        self._check()
        return frozenset(self.paused)

    async def queue_depths(
        self, floors: CountFloors | None = None, sweep: bool = True
    ) -> list[QueueDepth]:
        """Exact, whatever the floors (nothing here is ever dead)."""
        await asyncio.sleep(0)
        self._check()
        now = self.clock()
        found = []
        for queue in sorted({j.queue for j in self.jobs.values()}):
            held = [j for j in self.jobs.values() if j.queue == queue]
            due = [j for j in held if j.status is Status.PENDING and j.run_at <= now]
            found.append(
                QueueDepth(
                    queue,
                    len(due),
                    sum(1 for j in held if j.status is Status.PENDING and j.run_at > now),
                    sum(1 for j in held if j.status is Status.PROCESSING),
                    sum(1 for j in held if j.status is Status.DEAD_LETTER),
                    max((now - j.run_at for j in due), default=0.0),
                )
            )
        return found

    async def prune(self, status: Status, age_seconds: float) -> int:
        await asyncio.sleep(0)
        self._check()
        before = self.clock() - age_seconds
        old = [
            job.id
            for job in self.jobs.values()
            if job.status is status
            and job.finished_at is not None
            and job.finished_at < before
            and job.created_at < before
        ][:PRUNE_BATCH]
        for job_id in old:
            del self.jobs[job_id]
        return len(old)

    async def drop_history(self, age_seconds: float) -> int | None:
        await asyncio.sleep(0)
        self._check()
        return None  # no history table in memory

    async def move_history(
        self, retention_seconds: float, batch: int, after: float, since: datetime | None
    ) -> Moved:
        await asyncio.sleep(0)
        self._check()
        return Moved(0, None)  # one table in memory: a completed job is found where it is

    async def table_stats(self) -> list[TableStats]:
        await asyncio.sleep(0)
        self._check()
        return []  # nothing is ever dead in memory

    async def vacuum(self, table: str) -> None:
        await asyncio.sleep(0)
        self._check()
        self.vacuumed.append(table)

    async def record(
        self,
        operation: Operation,
        leases: Sequence[Lease],
        errors: Sequence[str] = (),
        delays: Sequence[float] = (),
        results: Sequence[str | None] = (),
        tracebacks: Sequence[str | None] = (),
    ) -> list[Lease]:
        """Fenced like the real store; the target status comes from the operation's declaration
        (of two, the one other than `cancelled`, which a requested cancel picks instead)."""
        if self.write_gate is not None:
            await self.write_gate.wait()
        await asyncio.sleep(0)
        self._check()
        self.writes.append((operation, len(leases)))
        (target,) = operation.targets - {Status.CANCELLED} or operation.targets
        lost = []
        for i, lease in enumerate(leases):
            job = self.jobs.get(lease.job_id)
            if (
                job is None
                or job.status not in operation.sources
                or job.lease_token != lease.lease_token
            ):
                lost.append(lease)
                continue
            job.status, job.locked_until = target, None
            if len(operation.targets) > 1 and job.cancel_requested:
                job.status = Status.CANCELLED
            # The operation's declared effects, as the real store's statement applies them.
            if operation.writes_result:
                job.result = results[i] if results else None
                job.last_error = None
            if operation.due_again:  # before the error: the delay counts the earlier ones
                if operation.delay_grows:
                    delay = unhandled_delay(
                        sum(1 for e in job.errors if e["attempt"] == job.attempts)
                    )
                else:
                    delay = delays[i]
                job.delay = delay
                job.run_at = self.clock() + delay
            if operation.writes_error:
                job.last_error = errors[i]
                job.failed(errors[i], tracebacks[i] if tracebacks else None, self.clock())
            if operation.gives_back:
                job.attempts -= 1
            if job.status in FINISHED:
                job.finished_at = self.clock()
        return lost

    async def complete_and_claim(
        self,
        leases: Sequence[Lease],
        slots: Mapping[str, int],
        lease_seconds: float,
        results: Sequence[str | None] = (),
    ) -> tuple[list[Lease], list[Claimed]]:
        """complete, then claim, with no other call in between (one statement in the real store)."""
        self.combined.append((len(leases), sum(slots.values())))
        lost = await self.record(Operation.COMPLETE, leases, results=results)
        return lost, self._claim_now(slots, lease_seconds)

    async def renew(self, leases: Sequence[Lease], lease_seconds: float) -> Renewed:
        await asyncio.sleep(0)
        self._check()
        self.renewals.append(len(leases))
        lost = []
        cancel = []
        busy = []
        for lease in leases:
            job = self.jobs.get(lease.job_id)
            if (
                job is None
                or job.status is not Status.PROCESSING
                or job.lease_token != lease.lease_token
            ):
                lost.append(lease)
                continue
            if job.locked:
                busy.append(lease)
            else:
                job.locked_until = self.clock() + lease_seconds
            if job.cancel_requested:
                cancel.append(lease)
        return Renewed(lost, cancel, busy)

    async def recover_expired(self) -> list[tuple[UUID, Status]]:
        await asyncio.sleep(0)
        self._check()
        now = self.clock()
        recovered = []
        for job in self.jobs.values():
            expired = job.locked_until is not None and job.locked_until < now
            if job.status is Status.PROCESSING and expired:
                if job.cancel_requested:
                    job.status = Status.CANCELLED
                elif out_of_attempts(job.attempts, job.max_attempts):
                    job.status = Status.DEAD_LETTER
                else:
                    job.status = Status.PENDING
                job.locked_until = None
                job.last_error = f"lease expired during attempt {job.attempts}"
                job.failed(job.last_error, None, now)
                recovered.append((job.id, job.status))
        return recovered


if TYPE_CHECKING:  # `make lint` checks the fake against the protocols the real store has
    from jobqueue_worker.database import JobStore
    from jobqueue_worker.maintenance import MaintenanceStore

    _AS_JOB_STORE: JobStore = FakeStore()
    _AS_MAINTENANCE_STORE: MaintenanceStore = FakeStore()
