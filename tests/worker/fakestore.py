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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from jobcore.states import Operation, Status, out_of_attempts
from jobcore.store import Claimed, Lease


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


class DatabaseDown(ConnectionError):
    pass


class FakeStore:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.jobs: dict[UUID, FakeJob] = {}
        self.claims: list[int] = []  # n asked for by each claim
        self.writes: list[tuple[str, int]] = []  # (operation, batch size) of each outcome write
        self.combined: list[tuple[int, int]] = []  # (completions, n) of each complete_and_claim
        self.down = False
        self.failed_calls = 0
        self.on_claim: Callable[[int], None] = lambda n: None
        self.write_gate: asyncio.Event | None = None  # when set up, writes wait for it
        self._order = itertools.count()

    def add(self, type: str, payload: Any = None, max_attempts: int = 3) -> UUID:
        job_id = uuid.UUID(int=next(self._order) + 1)
        self.jobs[job_id] = FakeJob(job_id, type, {} if payload is None else payload, max_attempts)
        return job_id

    def status(self, job_id: UUID) -> Status:
        return self.jobs[job_id].status

    def _check(self) -> None:
        if self.down:
            self.failed_calls += 1
            raise DatabaseDown("connection refused")

    async def claim(self, n: int, lease_seconds: float) -> list[Claimed]:
        # on_claim sees the caller's state when it asked, before the round trip yields.
        self.on_claim(n)
        await asyncio.sleep(0)  # a round trip yields to the loop
        self._check()
        self.claims.append(n)
        return self._claim_now(n, lease_seconds)

    def _claim_now(self, n: int, lease_seconds: float) -> list[Claimed]:
        now = self.clock()
        due = [j for j in self.jobs.values() if j.status is Status.PENDING and j.run_at <= now]
        claimed = []
        for job in due[:n]:
            job.status = Status.PROCESSING
            job.attempts += 1
            job.lease_token += 1
            job.locked_until = now + lease_seconds
            claimed.append(
                Claimed(
                    job.id, job.type, job.payload, job.attempts, job.max_attempts, job.lease_token
                )
            )
        return claimed

    async def record(
        self,
        operation: Operation,
        leases: Sequence[Lease],
        errors: Sequence[str] = (),
        delays: Sequence[float] = (),
    ) -> list[Lease]:
        """Fenced like the real store; the target status comes from the operation's declaration."""
        if self.write_gate is not None:
            await self.write_gate.wait()
        await asyncio.sleep(0)
        self._check()
        self.writes.append((operation, len(leases)))
        (target,) = operation.targets
        lost = []
        for i, lease in enumerate(leases):
            job = self.jobs.get(lease.job_id)
            if (
                job is None
                or job.status is not operation.source
                or job.lease_token != lease.lease_token
            ):
                lost.append(lease)
                continue
            job.status, job.locked_until = target, None
            job.last_error = errors[i] if i < len(errors) and errors[i] else None
            if operation is Operation.RETRY_LATER:
                job.delay = delays[i]
                job.run_at = self.clock() + delays[i]
            if operation is Operation.RELEASE:
                job.attempts -= 1
        return lost

    async def complete_and_claim(
        self, leases: Sequence[Lease], n: int, lease_seconds: float
    ) -> tuple[list[Lease], list[Claimed]]:
        """complete, then claim, with no other call in between (one statement in the real store)."""
        self.combined.append((len(leases), n))
        lost = await self.record(Operation.COMPLETE, leases)
        return lost, self._claim_now(n, lease_seconds)

    async def recover_expired(self) -> list[tuple[UUID, Status]]:
        await asyncio.sleep(0)
        self._check()
        now = self.clock()
        recovered = []
        for job in self.jobs.values():
            expired = job.locked_until is not None and job.locked_until < now
            if job.status is Status.PROCESSING and expired:
                job.status = (
                    Status.DEAD_LETTER
                    if out_of_attempts(job.attempts, job.max_attempts)
                    else Status.PENDING
                )
                job.locked_until = None
                recovered.append((job.id, job.status))
        return recovered
