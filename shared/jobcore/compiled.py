"""The worker's hot statements at the driver's cost: `jobcore.store`'s constructs, compiled once.

SQLAlchemy spends more CPU on a statement (compiled-cache lookup, execution
context, result processing, the greenlet hop) than PostgreSQL spends on a
batched claim. The functions here run the very constructs of `jobcore.store`
(CLAIM, COMPLETE, COMPLETE_AND_CLAIM, FAIL, DEAD_LETTER, RETRY_LATER, RELEASE,
RECOVER_EXPIRED),
compiled to asyncpg's SQL at import, on an asyncpg connection, which prepares
each statement once and reuses it. Arguments and results are those of their
`jobcore.store` namesakes, and so is the single-statement atomicity.

The connection must come from an engine made by `jobcore.db.make_engine`:
SQLAlchemy sets its jsonb codec, which decodes payloads. Take it with
`(await conn.get_raw_connection()).driver_connection`, outside a transaction
(each statement then commits on its own).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from uuid import UUID

from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect

from jobcore import store
from jobcore.states import Status
from jobcore.store import Claimed, Lease

_DIALECT = asyncpg_dialect()  # type: ignore[no-untyped-call]


class Driver(Protocol):
    """The part of an asyncpg connection these functions use."""

    async def fetch(self, query: str, *args: Any) -> list[Any]: ...

    def is_closed(self) -> bool: ...


class Compiled:
    """A construct's SQL for asyncpg, and how to order its parameters."""

    __slots__ = ("_order", "sql")

    def __init__(self, statement: Any) -> None:
        compiled = statement.compile(dialect=_DIALECT)
        self.sql: str = compiled.string
        binds = compiled.binds
        # Per positional parameter: the caller's value by name (fixed=None), or the
        # literal the construct itself holds (e.g. `attempts + 1`).
        self._order: list[tuple[str, bool, Any]] = [
            (name, binds[name].required, binds[name].effective_value)
            for name in compiled.positiontup or ()
        ]

    @property
    def parameters(self) -> set[str]:
        """The names the caller supplies."""
        return {name for name, required, _ in self._order if required}

    def args(self, values: Mapping[str, Any]) -> list[Any]:
        return [values[name] if required else fixed for name, required, fixed in self._order]


CLAIM = Compiled(store.CLAIM)
COMPLETE = Compiled(store.COMPLETE)
COMPLETE_AND_CLAIM = Compiled(store.COMPLETE_AND_CLAIM)
FAIL = Compiled(store.FAIL)
DEAD_LETTER = Compiled(store.DEAD_LETTER)
RETRY_LATER = Compiled(store.RETRY_LATER)
RELEASE = Compiled(store.RELEASE)
RELEASE_CLAIM = Compiled(store.RELEASE_CLAIM)
RECOVER_EXPIRED = Compiled(store.RECOVER_EXPIRED)

# Claimed is built from the row by position: RETURNING must list its fields in order.
_CLAIMED_FIELDS = list(Claimed.__dataclass_fields__)
if [c["name"] for c in store.CLAIM.returning_column_descriptions] != _CLAIMED_FIELDS:
    raise RuntimeError("CLAIM's RETURNING columns must be Claimed's fields, in order")


async def claim(conn: Driver, n: int, lease_seconds: float, claim_id: UUID) -> list[Claimed]:
    """Lease up to n due jobs, skipping rows other claimers hold (as `store.claim`)."""
    if n < 1:
        raise ValueError(f"claim needs n >= 1, got {n}")
    values = {"n": n, "lease_seconds": lease_seconds, "claim": claim_id}
    rows = await conn.fetch(CLAIM.sql, *CLAIM.args(values))
    return [Claimed(*row) for row in rows]


async def _write(
    conn: Driver, statement: Compiled, leases: Sequence[Lease], **arrays: Sequence[Any]
) -> list[Lease]:
    if not leases:
        return []
    values = {
        "ids": [lease.job_id for lease in leases],
        "tokens": [lease.lease_token for lease in leases],
        **{name: list(values) for name, values in arrays.items()},
    }
    rows = await conn.fetch(statement.sql, *statement.args(values))
    if len(rows) == len(leases):
        return []
    applied = {Lease(row[0], row[1]) for row in rows}
    return [lease for lease in leases if lease not in applied]


async def complete(conn: Driver, leases: Sequence[Lease]) -> list[Lease]:
    """processing -> completed. Returns the leases that were lost (not applied)."""
    return await _write(conn, COMPLETE, leases)


async def complete_and_claim(
    conn: Driver, leases: Sequence[Lease], n: int, lease_seconds: float, claim_id: UUID
) -> tuple[list[Lease], list[Claimed]]:
    """`complete(leases)` and `claim(n, lease_seconds, claim_id)` in one statement.

    Returns (the lost leases, the claimed jobs)."""
    if n < 1:
        raise ValueError(f"claim needs n >= 1, got {n}")
    values = {
        "ids": [lease.job_id for lease in leases],
        "tokens": [lease.lease_token for lease in leases],
        "n": n,
        "lease_seconds": lease_seconds,
        "claim": claim_id,
    }
    rows = await conn.fetch(COMPLETE_AND_CLAIM.sql, *COMPLETE_AND_CLAIM.args(values))
    applied = set()
    claimed = []
    for row in rows:
        if row[0]:
            applied.add(Lease(row[1], row[6]))
        else:
            claimed.append(Claimed(row[1], row[2], row[3], row[4], row[5], row[6]))
    if len(applied) == len(leases):
        return [], claimed
    return [lease for lease in leases if lease not in applied], claimed


async def fail(conn: Driver, leases: Sequence[Lease], errors: Sequence[str]) -> list[Lease]:
    """processing -> failed (permanent error). Returns the lost leases."""
    return await _write(conn, FAIL, leases, errors=errors)


async def dead_letter(conn: Driver, leases: Sequence[Lease], errors: Sequence[str]) -> list[Lease]:
    """processing -> dead_letter (retryable error on the last attempt). Returns the lost leases."""
    return await _write(conn, DEAD_LETTER, leases, errors=errors)


async def retry_later(
    conn: Driver, leases: Sequence[Lease], errors: Sequence[str], delays: Sequence[float]
) -> list[Lease]:
    """processing -> pending, due after `delay` seconds. Returns the lost leases."""
    return await _write(conn, RETRY_LATER, leases, errors=errors, delays=delays)


async def release(conn: Driver, leases: Sequence[Lease]) -> list[Lease]:
    """processing -> pending without spending an attempt (shutdown). Returns the lost leases."""
    return await _write(conn, RELEASE, leases)


async def release_claim(conn: Driver, claim_ids: Sequence[UUID]) -> list[UUID]:
    """processing -> pending, attempt given back, for every job these claims took."""
    rows = await conn.fetch(RELEASE_CLAIM.sql, *RELEASE_CLAIM.args({"claim_ids": list(claim_ids)}))
    return [row[0] for row in rows]


async def recover_expired(conn: Driver) -> list[tuple[UUID, Status]]:
    """Jobs whose lease ran out go back to pending, or to dead_letter after their last attempt."""
    rows = await conn.fetch(RECOVER_EXPIRED.sql, *RECOVER_EXPIRED.args({}))
    return [(row[0], Status(row[1])) for row in rows]
