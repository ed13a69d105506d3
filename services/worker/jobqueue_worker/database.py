"""The worker's view of the database: the `JobStore` protocol and its PostgreSQL implementation.

The dispatcher, completer and recovery loop depend only on `JobStore`, so unit
tests can hand them an in-memory store. `PgJobStore` runs each store operation
(a transaction, of one statement mostly) under a client-side timeout that also covers a
connection gone silent, and logs the database's availability once per change of state,
not once per call.

The statements are `jobcore.queries`', run through `jobcore.compiled` on the
asyncpg connection, the hot path's cost being the driver's alone. For the same
reason a connection stays checked out of the engine's pool between calls; one
that failed in any way is closed and replaced, so a broken one is never reused.
Statements are planned at every run, for the table as it is, and bounded by the server.
Those settings (`SETTINGS`) are a call's transaction's own, `SET LOCAL` in the round trip of
its BEGIN, never the session's: through a pooler in transaction mode the session is shared
with other clients (the API's submits must not commit asynchronously because the worker
does), and a pooler refuses settings sent as startup parameters. A session that has them
already (its role's, `ALTER ROLE ... SET`, which a pooler keeps to that role's server
connections) runs its calls as they are, two round trips fewer.

Claims and recovery start their index reads past what this process already took
(`jobcore.floors`): the dead entries a held MVCC horizon keeps in the indexes are read
only by the occasional read from the head (a sweep, or `check_floors` off the claims'
path), not by every call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar
from uuid import UUID, uuid4

import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from jobcore import compiled, maintenance
from jobcore.errors import describe
from jobcore.floors import ClaimFloors, CountFloors, Sweeps, TypeFloors
from jobcore.queries import RECOVER_BATCH
from jobcore.rows import Claimed, Lease, LimitedClaim, Moved, Renewed, TableStats, TypeLimits
from jobcore.runner import Driver
from jobcore.search import QueueDepth
from jobcore.settings.parsing import key_limits_of
from jobcore.states import Operation, Status
from jobcore.turns import KeyedQueues, KeyTurns

log = logging.getLogger("jobqueue.worker")

T = TypeVar("T")

# Limits on every statement of a worker connection, enforced by the server. They sit below
# the client's own limit (CALL_TIMEOUT), so a statement the worker stops waiting for has
# already been stopped by the server and cannot commit behind the worker's back (jobs
# claimed that no slot runs, their attempt spent when the lease runs out). A backend whose
# client went away checks for it every CONNECTION_CHECK and stops too. What is left, a
# commit whose answer was lost on the way, is handed back by `release_claim`.
STATEMENT_TIMEOUT = 4.0
LOCK_TIMEOUT = 2.0
CONNECTION_CHECK = 1.0
# A process stopped (SIGSTOP, a frozen machine) inside one of its transactions would keep
# its locks (the rows a claim took, the KEY_CONCURRENCY locks other claimers wait for or
# pass over) as long as it stays stopped: its session ends after this
# long idle in the transaction, which is rolled back (a store call's statements follow each
# other at once).
IDLE_IN_TRANSACTION = 5.0
CALL_TIMEOUT = STATEMENT_TIMEOUT + 2.0
# Connections per child: one each for the dispatcher, the completer, recovery, the heartbeat and
# the check of the claim floors, plus one for the periodic scheduler (at its ticks only), plus
# one the maintenance loops (queue gauges, retention, vacuum) take turns on, plus one a VACUUM
# runs on (while it runs). The read of the paused queues (a moment a second) takes whichever
# is idle: the scheduler's, the VACUUM's, most of the time any.
POOL_SIZE = 8
# Tries of a call on fresh connections when asyncpg refused to start it on a broken one.
_NEVER_SENT_TRIES = 3
# Claims whose answer was lost, kept for release_claim until it applies (bounded memory: a
# claim not handed back is recovered, attempt counted, once its lease runs out).
_MAX_LOST_CLAIMS = 1000
# The settings every store call runs under, as `current_setting()` shows them. Each
# statement is planned once per connection (a generic plan: planning the claims costs more
# than running them), and with sorts and sequential scans off the planner has no way to run
# one but the index walk in order it was written for, whatever the statistics said when it
# planned (`tests/worker/test_store_plans.py`: plans made on a tiny table, then a burst).
# JIT compiles
# a statement for tens of ms: never worth it for these short ones (and enable_sort = off
# makes the planner think some of them costly enough to try). Off by its cost threshold,
# not by `jit` itself: asyncpg turns `jit` off for the session around its type
# introspection and turns it back on only if it found it on, so a transaction that had it
# off would leave the session (through a pooler, another client's) without JIT.
SETTINGS = {
    "plan_cache_mode": "force_generic_plan",
    "enable_sort": "off",
    "enable_seqscan": "off",
    "jit_above_cost": "-1",
    "statement_timeout": f"{STATEMENT_TIMEOUT:g}s",
    "lock_timeout": f"{LOCK_TIMEOUT:g}s",
    "client_connection_check_interval": f"{CONNECTION_CHECK:g}s",
    "idle_in_transaction_session_timeout": f"{IDLE_IN_TRANSACTION:g}s",
}
# WORKER_SYNCHRONOUS_COMMIT=off (docs/worker.md, "Commit latency"): the store's commits
# (claims, outcomes, heartbeats, recovery, maintenance) return before their WAL is flushed.
# The store's calls only: the periodic scheduler's submits, which share the engine, stay
# synchronous like every other submit.
ASYNC_COMMIT = {"synchronous_commit": "off"}


def _begin(settings: Mapping[str, str]) -> str:
    """BEGIN and the settings, SET LOCAL: one round trip."""
    return "BEGIN; " + "; ".join(f"SET LOCAL {name} = '{v}'" for name, v in settings.items())


def _has(settings: Mapping[str, str]) -> str:
    """Whether a session has every one of `settings` already (its role's or its database's,
    `ALTER ROLE ... SET`): then its calls need no transaction of their own for them."""
    return "SELECT " + " AND ".join(
        f"current_setting('{name}') = '{value}'" for name, value in settings.items()
    )


# Recovery reads leases that ran out since its last complete run started, and this much
# before: the later run's statement may start up to a call's time after it was asked for.
_RECOVERY_SLACK = CALL_TIMEOUT + 1.0
# Recovery from the head of the lease index (for a lease a run skipped because another
# transaction held its row): paced by its cost, at least this often.
_RECOVERY_SWEEP_INTERVAL = 30.0
# The server's limit on one VACUUM (a big table after a long held horizon).
VACUUM_TIMEOUT = 600.0


class JobStore(Protocol):
    """The store calls a worker process makes, as in `jobcore.compiled`; outcome writes
    return the lost leases."""

    async def claim(self, slots: Mapping[str, int], lease_seconds: float) -> list[Claimed]: ...

    async def claim_limited(
        self,
        slots: Mapping[str, int],
        lease_seconds: float,
        overruns: Mapping[str, int] | None = None,
    ) -> LimitedClaim: ...

    async def next_due(self, queues: Sequence[str]) -> float | None: ...

    async def record(
        self,
        operation: Operation,
        leases: Sequence[Lease],
        errors: Sequence[str] = (),
        delays: Sequence[float] = (),
        results: Sequence[str | None] = (),
        tracebacks: Sequence[str | None] = (),
    ) -> list[Lease]: ...

    async def complete_and_claim(
        self,
        leases: Sequence[Lease],
        slots: Mapping[str, int],
        lease_seconds: float,
        results: Sequence[str | None] = (),
    ) -> tuple[list[Lease], list[Claimed]]: ...

    async def recover_expired(self) -> list[tuple[UUID, Status]]: ...

    async def renew(self, leases: Sequence[Lease], lease_seconds: float) -> Renewed: ...


class Availability:
    """Remembers whether the database answered lately; logs only when that changes.

    A call that started before the latest success says nothing new when it fails
    (it may have hung on a connection that broke earlier), so it does not count.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.up = True
        self._clock = clock
        self._last_success = float("-inf")

    def now(self) -> float:
        return self._clock()

    def succeeded(self, started: float) -> None:
        self._last_success = max(self._last_success, started)
        if not self.up:
            self.up = True
            log.info("database available again")

    def failed(self, operation: str, exc: BaseException, started: float) -> None:
        if self.up and started >= self._last_success:
            self.up = False
            log.warning(
                "database unavailable", extra={"operation": operation, "error": describe(exc)}
            )


class PgJobStore:
    """`JobStore` over `jobcore.compiled`: one statement per call, each under a timeout."""

    def __init__(
        self,
        engine: AsyncEngine,
        availability: Availability | None = None,
        limits: TypeLimits | None = None,
        *,
        synchronous_commit: bool = True,
        key_concurrency: Mapping[str, int] | None = None,
        key_overruns: Callable[[], Mapping[tuple[str, str], int]] = dict,
    ) -> None:
        self.engine = engine
        settings = SETTINGS if synchronous_commit else {**SETTINGS, **ASYNC_COMMIT}
        self._begin = _begin(settings)
        self._has_settings = _has(settings)
        # Per connection: whether its session has the settings already (None: not known yet).
        self._preset: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self.availability = availability or Availability()
        # TYPE_CONCURRENCY / TYPE_RATE: the ordinary claims skip these types, which only
        # `claim_limited` takes. Empty: the claims are exactly those of a worker without limits.
        self.limits = limits or TypeLimits()
        self._limited = self.limits.types
        # Connections checked out of the engine and kept between calls, with their asyncpg
        # connection: at most one per concurrent caller (dispatcher, completer, recovery).
        self._idle: list[tuple[AsyncConnection, Driver]] = []
        self._lost_claims: list[UUID] = []
        self.floors = ClaimFloors()
        self.type_floors = TypeFloors(self._limited)
        self.turns = KeyTurns()
        self.keyed = KeyedQueues()
        # KEY_CONCURRENCY: queue (or "*") -> n; and, per (queue, key), this process's
        # handlers that outlived their recorded attempts (`Executor.key_overruns`).
        self._key_concurrency = dict(key_concurrency or {})
        self._key_overruns = key_overruns
        # Recovery has no other read from the head: it sweeps by its cost alone.
        self._recovery_sweeps = Sweeps(max_interval=_RECOVERY_SWEEP_INTERVAL, cheap=math.inf)
        # When the last recovery run that took back every lease it saw expire started.
        self._recovered_at: float | None = None

    async def _run(self, operation: str, statement: Callable[..., Awaitable[T]], *args: Any) -> T:
        if self._lost_claims and operation != Operation.RELEASE_CLAIM:
            # A call of its own, under its own time limit; if it fails, the claims wait for
            # the next call and this one goes ahead.
            with contextlib.suppress(Exception):
                await self._run(Operation.RELEASE_CLAIM, self._release_lost_claims)
        started = self.availability.now()
        held = None
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                for tried in range(1, _NEVER_SENT_TRIES + 1):
                    try:
                        held = await (self._connection() if tried == 1 else self._checkout())
                    except Exception as exc:
                        # A new connection whose backend was terminated while SQLAlchemy set
                        # it up (its type codecs): nothing of the call was sent.
                        if tried == _NEVER_SENT_TRIES or not _never_sent(exc):
                            raise
                        continue
                    try:
                        result = await self._transaction(held[1], statement, *args)
                        break
                    except Exception as exc:
                        if tried == _NEVER_SENT_TRIES or not _never_sent(exc):
                            raise
                        # The connection broke while it sat idle (its backend was
                        # terminated): nothing reached the server, so the statement runs
                        # on a fresh one.
                        log.debug("connection broken before use", extra={"error": describe(exc)})
                        await _discard(held)
                        held = None
        except BaseException as exc:
            if held is not None:
                await _discard(held)
            if isinstance(exc, Exception):
                self.availability.failed(operation, exc, started)
            raise
        assert held is not None  # the loop ends with a result, or raises
        self._idle.append(held)
        self.availability.succeeded(started)
        return result

    async def _transaction(
        self, driver: Any, statement: Callable[..., Awaitable[T]], *args: Any
    ) -> T:
        """`statement` under the store's settings: in a transaction that SETs them LOCAL,
        unless the session has them already (then as it is: two round trips fewer). On any
        failure the connection is discarded (`_run`), which rolls back whatever was not
        committed."""
        preset = self._preset.get(driver)
        if preset is None:
            preset = self._preset[driver] = bool(await driver.fetchval(self._has_settings))
        if preset:
            return await statement(driver, *args)
        await driver.execute(self._begin)
        result = await statement(driver, *args)
        await driver.execute("COMMIT")
        return result

    async def _connection(self) -> tuple[AsyncConnection, Driver]:
        """A kept connection that is still open, else a new one."""
        while self._idle:
            held = self._idle.pop()
            if not held[1].is_closed():
                return held
            await _discard(held)
        return await self._checkout()

    async def _claiming(self, claim: Callable[[UUID], Awaitable[T]]) -> T:
        """Run a statement that claims jobs under a fresh claim id; if its answer is lost, the
        id is kept so that the jobs it may have taken are handed back by the next call."""
        claim_id = uuid4()
        try:
            return await claim(claim_id)
        except BaseException:
            self._lost_claims.append(claim_id)
            del self._lost_claims[:-_MAX_LOST_CLAIMS]
            raise

    async def _release_lost_claims(self, driver: Driver) -> None:
        lost = list(self._lost_claims)
        released = await compiled.release_claim(driver, lost)
        # Claims lost meanwhile (another caller's) stay for the next call.
        self._lost_claims = [claim_id for claim_id in self._lost_claims if claim_id not in lost]
        for job_id in released:
            log.warning("lost claim released", extra={"job_id": str(job_id)})

    async def _checkout(self) -> tuple[AsyncConnection, Driver]:
        conn = await self.engine.connect()
        try:
            raw = await conn.get_raw_connection()
        except BaseException:
            await conn.close()
            raise
        driver = raw.driver_connection
        assert driver is not None  # a checked-out connection has one
        return conn, driver

    async def close(self) -> None:
        """Give the kept connections back to the engine (before it is disposed)."""
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            await conn.close()

    async def _floored(
        self,
        slots: Mapping[str, int],
        claim: Callable[[Mapping[str, list[Any]], Mapping[str, list[Any]]], Awaitable[T]],
        taken: Callable[[T], list[Claimed]],
    ) -> T:
        """Run `claim(floors, turns)` from this process's floors, or from the head when a
        sweep is due, and its key turns; the floors (the key-less jobs' and the keys') and
        the turns then learn from the jobs it took (`taken(result)`)."""
        started = self.availability.now()
        sweep = self.floors.sweeps.due(started)
        since = self.floors.generation  # a check that lowers floors meanwhile is kept
        result = await claim(self.floors.params(slots, sweep=sweep), self.turns.params(slots))
        if sweep:
            self.floors.sweeps.done(started, self.availability.now())
        jobs = taken(result)
        keyless = [job for job in jobs if job.concurrency_key is None]
        self.floors.learn(keyless, sweep=sweep, since=since)
        self.floors.learn_keys(jobs, sweep=sweep, since=since)
        self.turns.learn(jobs)
        self.keyed.learn(jobs)
        return result

    def _plain(self, slots: Mapping[str, int], key_limits: Mapping[str, int]) -> bool:
        """Whether this claim may be the plain one (`jobcore.turns.KeyedQueues`)."""
        return not key_limits and self.keyed.plain(q for q, n in slots.items() if n > 0)

    def _key_limits(self, slots: Mapping[str, int]) -> dict[str, int]:
        return key_limits_of(self._key_concurrency, slots)

    async def claim(self, slots: Mapping[str, int], lease_seconds: float) -> list[Claimed]:
        limits = self._key_limits(slots)
        return await self._floored(
            slots,
            lambda floors, turns: self._claiming(
                lambda claim_id: self._run(
                    Operation.CLAIM,
                    compiled.claim,
                    slots,
                    lease_seconds,
                    claim_id,
                    self._limited,
                    floors,
                    turns,
                    limits,
                    self._key_overruns() if self._key_concurrency else None,
                    self._plain(slots, limits),
                )
            ),
            lambda jobs: jobs,
        )

    async def claim_limited(
        self,
        slots: Mapping[str, int],
        lease_seconds: float,
        overruns: Mapping[str, int] | None = None,
    ) -> LimitedClaim:
        # The other types' jobs it ranks against are read from the floors; it takes none of
        # them, so the floors learn nothing from it. The limited types' own are read from
        # theirs, which it does learn.
        floors = self.floors.params(slots, sweep=False)
        key_limits = self._key_limits(slots)
        started = self.availability.now()
        sweep = self.type_floors.sweeps.due(started)
        floored = [queue for queue in slots if key_limits.get(queue) is None]
        type_floors = self.type_floors.params(floored, sweep=sweep)
        since = self.type_floors.generation
        try:
            got = await self._claiming(
                lambda claim_id: self._run(
                    "claim_limited",
                    compiled.claim_limited,
                    self.limits,
                    slots,
                    lease_seconds,
                    claim_id,
                    floors,
                    overruns,
                    key_limits,
                    self._key_overruns() if self._key_concurrency else None,
                    type_floors,
                )
            )
        finally:
            # A sweep that failed counts as one: the claims after it go on from the floors.
            if sweep:
                self.type_floors.sweeps.done(started, self.availability.now())
        self.type_floors.learn(got.jobs, got.running, sweep=sweep, since=since)
        return got

    async def check_floors(self, queues: Sequence[str]) -> float:
        """Lower the claim floors that a due job of `queues` lies below (found from the head
        of the claim index, off the claims' path), and, where KEY_CONCURRENCY applies, set
        the key lease floor; the seconds the check took."""
        started = self.availability.now()
        keys = self.floors.keys(queues)
        read = await self._run("claim_heads", compiled.check_heads, queues, keys)
        ended = self.availability.now()
        cost = ended - started
        known = len(keys["key_floor_keys"])
        self.floors.checked(cost, ended, keys=known, heads=len(read.heads), entries=read.entries)
        self.floors.lower(read.heads)
        self.type_floors.lower(read.heads)
        keyed = list(key_limits_of(self._key_concurrency, queues))
        if keyed:
            first = await self._run(
                "key_lease_first", compiled.key_lease_first, keyed, self.floors.key_leases
            )
            self.floors.learn_key_leases(first)
            cost = self.availability.now() - started
        return cost

    async def next_due(self, queues: Sequence[str]) -> float | None:
        floors = self.floors.params(queues, sweep=False)
        return await self._run("next_due", compiled.next_due, queues, floors)

    async def record(
        self,
        operation: Operation,
        leases: Sequence[Lease],
        errors: Sequence[str] = (),
        delays: Sequence[float] = (),
        results: Sequence[str | None] = (),
        tracebacks: Sequence[str | None] = (),
    ) -> list[Lease]:
        return await self._run(
            operation, compiled.record, operation, leases, errors, delays, results, tracebacks
        )

    async def complete_and_claim(
        self,
        leases: Sequence[Lease],
        slots: Mapping[str, int],
        lease_seconds: float,
        results: Sequence[str | None] = (),
    ) -> tuple[list[Lease], list[Claimed]]:
        limits = self._key_limits(slots)
        return await self._floored(
            slots,
            lambda floors, turns: self._claiming(
                lambda claim_id: self._run(
                    Operation.COMPLETE,
                    compiled.complete_and_claim,
                    leases,
                    slots,
                    lease_seconds,
                    claim_id,
                    self._limited,
                    results,
                    floors,
                    turns,
                    limits,
                    self._key_overruns() if self._key_concurrency else None,
                    self._plain(slots, limits),
                )
            ),
            lambda result: result[1],
        )

    async def recover_expired(self) -> list[tuple[UUID, Status]]:
        started = self.availability.now()
        last = self._recovered_at
        sweep = last is None or self._recovery_sweeps.due(started)
        window = None if sweep or last is None else started - last + _RECOVERY_SLACK
        recovered = await self._run(Operation.RECOVER_EXPIRED, compiled.recover_expired, window)
        if sweep:
            self._recovery_sweeps.done(started, self.availability.now())
        if len(recovered) < RECOVER_BATCH:
            self._recovered_at = started
        return recovered

    async def renew(self, leases: Sequence[Lease], lease_seconds: float) -> Renewed:
        return await self._run(Operation.RENEW, compiled.renew, leases, lease_seconds)

    async def take_lead(self, task: str, holder: UUID, lease_seconds: float) -> bool:
        return await self._run("take_lead", compiled.take_lead, task, holder, lease_seconds)

    async def resign(self, task: str, holder: UUID) -> None:
        await self._run("resign", compiled.resign, task, holder)

    async def queue_depths(
        self, floors: CountFloors | None = None, sweep: bool = True
    ) -> list[QueueDepth]:
        return await self._run("queue_depths", compiled.queue_depths, floors, sweep)

    async def notification_send(self, token: str) -> None:
        await self._run("notification_send", compiled.notification_send, token)

    async def paused_queues(self) -> frozenset[str]:
        return await self._run("paused_queues", compiled.paused_queues)

    async def record_types(self, records: Sequence[tuple[str, str, str]], by: str) -> None:
        await self._run("record_types", compiled.record_types, records, by)

    async def prune(self, status: Status, age_seconds: float) -> int:
        return await self._run("prune", compiled.prune, status, age_seconds)

    async def drop_history(self, age_seconds: float) -> int | None:
        """Drop the oldest leaf of `jobs_history` that expired whole, in a transaction of
        its own (its lock held no longer than the drop); its jobs, or None if none."""
        return await self._run("prune", compiled.history_drop_expired, age_seconds)

    async def move_history(
        self, retention_seconds: float, batch: int, after: float, since: datetime | None
    ) -> Moved:
        return await self._run(
            "move_history", compiled.history_move, retention_seconds, batch, after, since
        )

    async def table_stats(self) -> list[TableStats]:
        return await self._run("table_stats", compiled.table_stats)

    async def vacuum(self, table: str) -> None:
        """VACUUM `table` on a connection of its own, closed after, under VACUUM_TIMEOUT
        instead of the worker's statement limit. VACUUM runs in no transaction, so nothing
        can be SET LOCAL for it: asyncpg cancels it on the server when the time is up (a
        cancel request, which a pooler passes on), and it skips a table it cannot lock
        at once."""
        conn = await self.engine.connect()
        try:
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None  # a checked-out connection has one
            async with asyncio.timeout(VACUUM_TIMEOUT + CALL_TIMEOUT):
                await driver.execute(maintenance.vacuum_sql(table), timeout=VACUUM_TIMEOUT)
        finally:
            await conn.invalidate()
            await conn.close()


def _never_sent(exc: Exception) -> bool:
    """Whether asyncpg refused to start the statement (so nothing reached the server): the
    connection is closed, or an error its backend sent while it sat idle left it mid-way."""
    if isinstance(exc, asyncpg.InterfaceError):
        return "connection is closed" in str(exc)
    if isinstance(exc, asyncpg.InternalClientError):
        return str(exc).startswith("cannot switch to state") or str(exc) == "not connected"
    return False


async def _discard(held: tuple[AsyncConnection, Any]) -> None:
    """Drop a connection a call failed on: whatever state it is in, it is not reused."""
    conn, driver = held
    # terminate() first: closing a silent connection gracefully would wait on it.
    driver.terminate()
    try:
        await conn.invalidate()
        await conn.close()
    except Exception:
        log.debug("closing a failed connection failed", exc_info=True)
