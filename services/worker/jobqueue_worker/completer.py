"""The batched completer: records attempt outcomes, many jobs per statement.

Executors hand an `Outcome` to `Completer.record()` and wait for it. The
completer gathers outcomes for a few milliseconds, or until `batch_size` are
waiting, then writes each kind (complete, fail, dead_letter, retry_later,
release) with one fenced statement. `record()` returns once the write committed
(True), or the lease was found lost or ran out while the database was failing
(False); only then may the executor free the job's slot, so a slot never runs
a second job while the first one's outcome is still unwritten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from jobcore.store import Lease
from jobqueue_worker.database import JobStore

log = logging.getLogger("jobqueue.worker")

KINDS = ("complete", "fail", "dead_letter", "retry_later", "release")

# Retry of a failed write: start fast, because most failures are one broken connection.
_RETRY_FIRST = 0.05
_RETRY_MAX = 2.0


@dataclass(frozen=True)
class Outcome:
    """What an attempt produced, for the job held under `lease`."""

    kind: str  # one of KINDS
    lease: Lease
    # Monotonic time at which the lease runs out (measured from just before the claim):
    # a write that keeps failing is retried until then, never after.
    deadline: float
    error: str | None = None
    delay: float = 0.0  # retry_later only: seconds until the job is due again


@dataclass(eq=False)
class _Waiting:
    outcome: Outcome
    done: asyncio.Future[bool]


class Completer:
    """Gathers outcomes and writes them in batches; see the module docstring."""

    def __init__(
        self,
        store: JobStore,
        *,
        batch_size: int = 100,
        linger: float = 0.002,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self._store = store
        self._batch_size = batch_size
        self._linger = linger
        self._clock = clock
        self._waiting: list[_Waiting] = []
        self._arrived = asyncio.Event()
        self._full = asyncio.Event()
        self._closing = False
        self._stopped = False

    async def record(self, outcome: Outcome) -> bool:
        """Write `outcome`; True if it applied, False if the lease was lost or ran out."""
        if outcome.kind not in KINDS:
            raise ValueError(f"unknown outcome kind {outcome.kind!r}")
        item = _Waiting(outcome, asyncio.get_running_loop().create_future())
        if self._stopped:
            # Late outcome after the loop ended: write it alone rather than drop it.
            await self._write([item])
        else:
            self._waiting.append(item)
            self._arrived.set()
            if len(self._waiting) >= self._batch_size:
                self._full.set()
        # The slot waits for the write even if its own task is being cancelled.
        return await asyncio.shield(item.done)

    def close(self) -> None:
        """Write what is waiting without lingering, then let `run()` return."""
        self._closing = True
        self._arrived.set()
        self._full.set()

    async def run(self) -> None:
        try:
            while True:
                if not self._waiting:
                    if self._closing:
                        return
                    self._arrived.clear()
                    await self._arrived.wait()
                    continue
                if len(self._waiting) < self._batch_size and not self._closing:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self._linger):
                            await self._full.wait()
                batch = self._waiting[: self._batch_size]
                del self._waiting[: self._batch_size]
                if len(self._waiting) < self._batch_size and not self._closing:
                    self._full.clear()
                await self._write(batch)
        finally:
            self._stopped = True
            if self._waiting:
                await self._write(self._waiting)
                self._waiting = []

    async def _write(self, batch: list[_Waiting]) -> None:
        for kind in KINDS:
            items = [item for item in batch if item.outcome.kind == kind]
            if items:
                await self._write_kind(kind, items)

    async def _write_kind(self, kind: str, items: list[_Waiting]) -> None:
        delay = _RETRY_FIRST
        while items:
            try:
                lost = set(await self._apply(kind, [item.outcome for item in items]))
            except Exception:
                # The store logs the outage; keep trying while the leases still hold.
                items = self._drop_expired(items, margin=delay)
                if items:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _RETRY_MAX)
                continue
            for item in items:
                applied = item.outcome.lease not in lost
                if not applied:
                    log.warning(
                        "lease lost",
                        extra={
                            "job_id": str(item.outcome.lease.job_id),
                            "lease_token": item.outcome.lease.lease_token,
                            "operation": kind,
                        },
                    )
                _resolve(item, applied)
            return

    def _drop_expired(self, items: list[_Waiting], margin: float) -> list[_Waiting]:
        now = self._clock()
        keep = []
        for item in items:
            if item.outcome.deadline > now + margin:
                keep.append(item)
                continue
            log.warning(
                "lease lost",
                extra={
                    "job_id": str(item.outcome.lease.job_id),
                    "lease_token": item.outcome.lease.lease_token,
                    "operation": item.outcome.kind,
                    "error": "the lease ran out before the outcome could be recorded",
                },
            )
            _resolve(item, False)
        return keep

    async def _apply(self, kind: str, outcomes: list[Outcome]) -> list[Lease]:
        leases = [o.lease for o in outcomes]
        errors = [o.error or "" for o in outcomes]
        if kind == "complete":
            return await self._store.complete(leases)
        if kind == "fail":
            return await self._store.fail(leases, errors)
        if kind == "dead_letter":
            return await self._store.dead_letter(leases, errors)
        if kind == "retry_later":
            return await self._store.retry_later(leases, errors, [o.delay for o in outcomes])
        return await self._store.release(leases)


def _resolve(item: _Waiting, applied: bool) -> None:
    if not item.done.done():
        item.done.set_result(applied)
