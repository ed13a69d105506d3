"""The batched completer: records attempt outcomes, many jobs per statement.

Executors hand an `Outcome` to `Completer.add()` with a callback. The completer
writes what has arrived as soon as it runs (outcomes that arrive while a write
is in flight make the next batch; with `linger` it also waits that long for
company, up to `batch_size`), each kind (complete with its results, fail,
dead_letter, cancel_attempt, retry_later, snooze, release, unhandled) with one fenced
statement. The callback gets True once the write committed, or False when the
lease was found lost or ran out while the database was failing; only then may
the executor free the job's slot, so a slot never runs a second job while the
first one's outcome is still unwritten.

With a `claimer` (the dispatcher), the statement that completes jobs also claims
as many for the slots it frees (and for the free slots no other claim is for):
their next jobs arrive with the commit that frees them, one round trip and one
WAL flush instead of two.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple, Protocol
from uuid import UUID

from jobcore import logs
from jobcore.backoff import Retry
from jobcore.rows import Claimed, Lease
from jobcore.states import ATTEMPT_OUTCOMES, Operation
from jobqueue_worker.database import JobStore

log = logging.getLogger("jobqueue.worker")

# Retries of a failed write start fast: most failures are one broken connection.
_RETRY_FIRST = 0.05
_RETRY_LIMIT = 2.0


class Outcome(NamedTuple):
    """What an attempt produced, for the job held under `lease`."""

    kind: Operation  # one of ATTEMPT_OUTCOMES
    lease: Lease
    queue: str  # whose slot the attempt holds
    # When the lease runs out (monotonic; heartbeats push it back while the outcome waits):
    # a write that keeps failing is retried until then, never after.
    deadline: Callable[[], float]
    error: str | None = None
    delay: float = 0.0  # retry_later and snooze: seconds until the job is due again
    result: str | None = None  # complete: the handler's return value as JSON text, None for none
    # The operations that write an error: the formatted exception (at most TRACEBACK_LIMIT
    # bytes, its end kept), None where nothing raised (a timeout, an unhandled type).
    traceback: str | None = None


Recorded = Callable[[bool], None]
_Waiting = tuple[Outcome, Recorded]


class Claimer(Protocol):
    """Who decides how many jobs a write may claim, and takes them (the dispatcher)."""

    @property
    def lease_seconds(self) -> float: ...

    def claimable(self, freeing: Mapping[str, int]) -> dict[str, int]: ...

    def hand_out(
        self, jobs: list[Claimed], asked: Mapping[str, int], claimed_at: float
    ) -> None: ...

    def wake(self) -> None: ...

    def claim_dropped(self) -> None: ...

    def finishing(self, job_ids: Iterable[UUID], written: bool) -> None: ...


class Completer:
    """Gathers outcomes and writes them in batches; see the module docstring."""

    def __init__(
        self,
        store: JobStore,
        *,
        batch_size: int = 100,
        linger: float = 0.0,
        claimer: Claimer | None = None,
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
        self._late: set[asyncio.Task[None]] = set()
        self.claimer = claimer

    def add(self, outcome: Outcome, recorded: Recorded) -> None:
        """Write `outcome`, then call `recorded(applied)`: True if it applied, False if the
        lease was lost or ran out."""
        if outcome.kind not in ATTEMPT_OUTCOMES:
            raise ValueError(f"unknown outcome kind {outcome.kind!r}")
        if self._stopped:
            # Late outcome after the loop ended: write it alone rather than drop it.
            task = asyncio.get_running_loop().create_task(self._write([(outcome, recorded)]))
            self._late.add(task)
            task.add_done_callback(self._late.discard)
            return
        self._waiting.append((outcome, recorded))
        self._arrived.set()
        if len(self._waiting) >= self._batch_size:
            self._full.set()

    async def record(self, outcome: Outcome) -> bool:
        """`add()` for a caller that awaits the result."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def recorded(applied: bool) -> None:
            if not done.done():
                done.set_result(applied)

        self.add(outcome, recorded)
        # The caller waits for the write even if its own task is being cancelled.
        return await asyncio.shield(done)

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
                lingering = self._linger > 0 and not self._closing
                if lingering and len(self._waiting) < self._batch_size:
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
                waiting, self._waiting = self._waiting, []
                await self._write(waiting)

    async def _write(self, batch: list[_Waiting]) -> None:
        by_kind: dict[Operation, list[_Waiting]] = {}
        for item in batch:
            by_kind.setdefault(item[0].kind, []).append(item)
        for kind in ATTEMPT_OUTCOMES:
            items = by_kind.get(kind)
            if items:
                await self._write_kind(kind, items)

    async def _write_kind(self, kind: Operation, items: list[_Waiting]) -> None:
        # In job id order, as the heartbeat renews: two writes of one process lock their
        # rows in the same order, so they cannot deadlock each other.
        items = sorted(items, key=lambda item: item[0].lease)
        retry = Retry(_RETRY_FIRST, _RETRY_LIMIT)
        delay = _RETRY_FIRST
        while items:
            outcomes = [outcome for outcome, _ in items]
            if self.claimer is not None:
                # Before `claimable`: a slot a job of a limited type frees is left to the
                # dispatcher, which claims limited types.
                self.claimer.finishing((o.lease.job_id for o in outcomes), False)
            # Every slot of the batch is free once it is written: claim for them meanwhile,
            # but only on the first try: a claim that failed must not hold completions back.
            first_try = retry.failures == 0
            claimer = self.claimer if kind is Operation.COMPLETE and first_try else None
            wanted = claimer.claimable(_per_queue(items)) if claimer is not None else {}
            claimed_at = self._clock()
            try:
                if claimer is not None and any(wanted.values()):
                    leases = [o.lease for o in outcomes]
                    results = [o.result for o in outcomes]
                    lost, claimed = await self._store.complete_and_claim(
                        leases, wanted, claimer.lease_seconds, results
                    )
                else:
                    lost, claimed = await self._record(kind, outcomes), []
            except BaseException as exc:
                if claimer is not None and any(wanted.values()):
                    claimer.claim_dropped()
                if not isinstance(exc, Exception):
                    raise  # cancelled: the slots it held are given back all the same
                # The store logs the outage; keep trying while the leases still hold.
                items = self._drop_expired(items, margin=delay)
                if items:
                    delay = retry.failed()
                    await asyncio.sleep(delay)
                continue
            lost_leases = set(lost)
            # The callbacks log a line per job: one write for the batch.
            with logs.batch():
                for outcome, recorded in items:
                    applied = not lost_leases or outcome.lease not in lost_leases
                    if not applied:
                        log.warning(
                            "lease lost",
                            extra={
                                "job_id": str(outcome.lease.job_id),
                                "lease_token": outcome.lease.lease_token,
                                "operation": kind,
                            },
                        )
                    _resolve(recorded, applied)
            if claimer is not None and any(wanted.values()):
                # Into the slots the callbacks just freed.
                claimer.hand_out(claimed, wanted, claimed_at)
            if self.claimer is not None:
                self.claimer.finishing((o.lease.job_id for o in outcomes), True)
            if kind.due_again and self.claimer is not None:
                # Jobs due again later: the dispatcher learns when the next one is due.
                self.claimer.wake()
            return

    def _drop_expired(self, items: list[_Waiting], margin: float) -> list[_Waiting]:
        now = self._clock()
        keep = []
        for outcome, recorded in items:
            if outcome.deadline() > now + margin:
                keep.append((outcome, recorded))
                continue
            log.warning(
                "lease lost",
                extra={
                    "job_id": str(outcome.lease.job_id),
                    "lease_token": outcome.lease.lease_token,
                    "operation": outcome.kind,
                    "error": "the lease ran out before the outcome could be recorded",
                },
            )
            _resolve(recorded, False)
        return keep

    async def _record(self, kind: Operation, outcomes: list[Outcome]) -> list[Lease]:
        leases = [o.lease for o in outcomes]
        if kind is Operation.COMPLETE:
            return await self._store.record(kind, leases, results=[o.result for o in outcomes])
        errors = [o.error or "" for o in outcomes]
        delays = [o.delay for o in outcomes]
        tracebacks = [o.traceback for o in outcomes]
        return await self._store.record(kind, leases, errors, delays, tracebacks=tracebacks)


def _per_queue(items: list[_Waiting]) -> dict[str, int]:
    """How many slots of each queue the write of `items` frees."""
    freeing: dict[str, int] = {}
    for outcome, _ in items:
        freeing[outcome.queue] = freeing.get(outcome.queue, 0) + 1
    return freeing


def _resolve(recorded: Recorded, applied: bool) -> None:
    try:
        recorded(applied)
    except Exception:  # one job's bookkeeping must not stop the others' outcomes
        log.exception("recording an outcome's result failed")
