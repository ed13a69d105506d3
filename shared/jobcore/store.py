"""Every job statement, one SQLAlchemy Core construct per store operation.

Each operation is a single statement, so it applies atomically or not at all.
Guards come from `jobcore.states.OPERATIONS`; outcome writes are batched
(`UPDATE ... FROM unnest(ids, tokens)`) and fenced by the lease token, and
report the leases that did not apply. All times come from the database clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.ext.asyncio import AsyncConnection

from jobcore.errors import IdempotencyConflict
from jobcore.schema import jobs
from jobcore.states import OPERATIONS, Status, source

c = jobs.c
_ONE_SECOND: Any = sa.literal_column("interval '1 second'")


def _lit(status: Status) -> Any:
    """A status as an SQL literal, never a parameter: the planner must see
    `status = 'pending'` to use the partial indexes, also in generic plans."""
    return sa.literal_column(f"'{status.value}'", sa.Text)


class Lease(NamedTuple):
    """What a worker holds after a claim: the right to write this job's outcome."""

    job_id: UUID
    lease_token: int


@dataclass(frozen=True)
class Claimed:
    id: UUID
    type: str
    payload: Any
    attempts: int
    max_attempts: int
    lease_token: int

    @property
    def lease(self) -> Lease:
        return Lease(self.id, self.lease_token)


@dataclass(frozen=True)
class NewJob:
    id: UUID
    type: str
    payload: Any
    max_attempts: int
    idempotency_key: str | None = None


@dataclass(frozen=True)
class Job:
    id: UUID
    type: str
    payload: Any
    status: Status
    attempts: int
    max_attempts: int
    run_at: datetime
    locked_until: datetime | None
    lease_token: int
    last_error: str | None
    idempotency_key: str | None
    created_at: datetime
    updated_at: datetime


_JOB_COLUMNS = [jobs.c[name] for name in Job.__dataclass_fields__]


def _job(row: Any) -> Job:
    values = {name: row[name] for name in Job.__dataclass_fields__}
    values["status"] = Status(values["status"])
    return Job(**values)


# --- submit ---------------------------------------------------------------

_insert = pg.insert(jobs)
SUBMIT = _insert.on_conflict_do_update(
    index_elements=[c.idempotency_key],
    index_where=c.idempotency_key.isnot(None),
    # A no-op update that locks and returns the existing row, even when it was
    # inserted by a concurrent transaction this statement's snapshot cannot see.
    set_={"idempotency_key": _insert.excluded.idempotency_key},
    where=sa.and_(
        c.type == _insert.excluded.type,
        c.payload == _insert.excluded.payload,
        c.max_attempts == _insert.excluded.max_attempts,
    ),
).returning(*_JOB_COLUMNS, sa.literal_column("(xmax = 0)").label("created"))


async def submit(conn: AsyncConnection, new: NewJob) -> tuple[Job, bool]:
    """Insert a job, or return the job already bound to its idempotency key.

    Returns (job, created). Raises IdempotencyConflict when the key is bound to
    a different type, payload (compared as jsonb) or max_attempts.
    """
    row = (
        (
            await conn.execute(
                SUBMIT,
                {
                    "id": new.id,
                    "type": new.type,
                    "payload": new.payload,
                    "max_attempts": new.max_attempts,
                    "idempotency_key": new.idempotency_key,
                },
            )
        )
        .mappings()
        .first()
    )
    if row is None:
        assert new.idempotency_key is not None
        raise IdempotencyConflict(new.idempotency_key)
    return _job(row), bool(row["created"])


# --- reads ----------------------------------------------------------------

GET = sa.select(*_JOB_COLUMNS).where(c.id == sa.bindparam("id"))


async def get(conn: AsyncConnection, job_id: UUID) -> Job | None:
    row = (await conn.execute(GET, {"id": job_id})).mappings().first()
    return _job(row) if row is not None else None


# --- claim ----------------------------------------------------------------

_due = (
    sa.select(c.id)
    .where(c.status == _lit(source("claim")), c.run_at <= sa.func.now())
    .order_by(c.run_at, c.id)
    .limit(sa.bindparam("n"))
    .with_for_update(skip_locked=True)
    .cte("due")
    .prefix_with("MATERIALIZED")
)
CLAIM = (
    sa.update(jobs)
    .where(c.id == _due.c.id, c.status == _lit(source("claim")))
    .values(
        status=_lit(Status.PROCESSING),
        attempts=c.attempts + 1,
        lease_token=c.lease_token + 1,
        locked_until=sa.func.now() + sa.bindparam("lease_seconds", type_=sa.Float) * _ONE_SECOND,
        updated_at=sa.func.now(),
    )
    .returning(c.id, c.type, c.payload, c.attempts, c.max_attempts, c.lease_token)
)


async def claim(conn: AsyncConnection, n: int, lease_seconds: float) -> list[Claimed]:
    """Lease up to n due jobs, skipping rows other claimers hold."""
    if n < 1:
        raise ValueError(f"claim needs n >= 1, got {n}")
    result = await conn.execute(CLAIM, {"n": n, "lease_seconds": lease_seconds})
    return [Claimed(**row) for row in result.mappings()]


# --- fenced outcome writes --------------------------------------------------


def _unnest(**arrays: tuple[str, Any]) -> Any:
    """`unnest(:ids, :tokens, ...) AS o(id, token, ...)`: one row per job in the batch."""
    params = [sa.bindparam(param, type_=pg.ARRAY(type_)) for param, type_ in arrays.values()]
    columns = [sa.column(name, type_) for name, (_, type_) in arrays.items()]
    return sa.func.unnest(*params).table_valued(*columns).render_derived(name="o")


_LEASES = {"id": ("ids", pg.UUID(as_uuid=True)), "token": ("tokens", sa.BigInteger)}
_ERRORS = {"error": ("errors", sa.Text)}
_DELAYS = {"delay": ("delays", sa.Float)}


def _fenced(operation: str, o: Any, **values: Any) -> Any:
    """Apply `operation` to each (id, token) whose lease is still the current one."""
    (target,) = OPERATIONS[operation].targets
    return (
        sa.update(jobs)
        .where(c.id == o.c.id, c.status == _lit(source(operation)), c.lease_token == o.c.token)
        .values(status=_lit(target), locked_until=sa.null(), updated_at=sa.func.now(), **values)
        .returning(c.id)
    )


_o = _unnest(**_LEASES)
_oe = _unnest(**_LEASES, **_ERRORS)
_oed = _unnest(**_LEASES, **_ERRORS, **_DELAYS)

COMPLETE = _fenced("complete", _o, last_error=sa.null())
FAIL = _fenced("fail", _oe, last_error=_oe.c.error)
DEAD_LETTER = _fenced("dead_letter", _oe, last_error=_oe.c.error)
RETRY_LATER = _fenced(
    "retry_later", _oed, last_error=_oed.c.error, run_at=sa.func.now() + _oed.c.delay * _ONE_SECOND
)
# Shutdown interrupted the attempt through no fault of the job: give the attempt back.
RELEASE = _fenced("release", _o, attempts=c.attempts - 1)


async def _write(
    conn: AsyncConnection, statement: Any, leases: Sequence[Lease], **arrays: Sequence[Any]
) -> list[Lease]:
    if not leases:
        return []
    params = {
        "ids": [lease.job_id for lease in leases],
        "tokens": [lease.lease_token for lease in leases],
        **{name: list(values) for name, values in arrays.items()},
    }
    applied = set((await conn.execute(statement, params)).scalars())
    return [lease for lease in leases if lease.job_id not in applied]


async def complete(conn: AsyncConnection, leases: Sequence[Lease]) -> list[Lease]:
    """processing -> completed. Returns the leases that were lost (not applied)."""
    return await _write(conn, COMPLETE, leases)


async def fail(
    conn: AsyncConnection, leases: Sequence[Lease], errors: Sequence[str]
) -> list[Lease]:
    """processing -> failed (permanent error). Returns the lost leases."""
    return await _write(conn, FAIL, leases, errors=errors)


async def dead_letter(
    conn: AsyncConnection, leases: Sequence[Lease], errors: Sequence[str]
) -> list[Lease]:
    """processing -> dead_letter (retryable error on the last attempt). Returns the lost leases."""
    return await _write(conn, DEAD_LETTER, leases, errors=errors)


async def retry_later(
    conn: AsyncConnection,
    leases: Sequence[Lease],
    errors: Sequence[str],
    delays: Sequence[float],
) -> list[Lease]:
    """processing -> pending, due after `delay` seconds. Returns the lost leases."""
    return await _write(conn, RETRY_LATER, leases, errors=errors, delays=delays)


async def release(conn: AsyncConnection, leases: Sequence[Lease]) -> list[Lease]:
    """processing -> pending without spending an attempt (shutdown). Returns the lost leases."""
    return await _write(conn, RELEASE, leases)


# --- maintenance and operator actions ----------------------------------------

RECOVER_EXPIRED = (
    sa.update(jobs)
    .where(c.status == _lit(source("recover_expired")), c.locked_until < sa.func.now())
    .values(
        status=sa.case(
            (c.attempts >= c.max_attempts, _lit(Status.DEAD_LETTER)),
            else_=_lit(Status.PENDING),
        ),
        locked_until=sa.null(),
        last_error=sa.func.concat("lease expired during attempt ", c.attempts),
        updated_at=sa.func.now(),
    )
    .returning(c.id, c.status)
)


async def recover_expired(conn: AsyncConnection) -> list[tuple[UUID, Status]]:
    """Jobs whose lease ran out go back to pending, or to dead_letter after their last attempt."""
    result = await conn.execute(RECOVER_EXPIRED)
    return [(row.id, Status(row.status)) for row in result]


MANUAL_RETRY = (
    sa.update(jobs)
    .where(c.id == sa.bindparam("job_id"), c.status == _lit(source("manual_retry")))
    .values(
        status=_lit(Status.PENDING),
        attempts=0,
        run_at=sa.func.now(),
        updated_at=sa.func.now(),
    )
    .returning(*_JOB_COLUMNS)
)


async def manual_retry(conn: AsyncConnection, job_id: UUID) -> Job | None:
    """dead_letter -> pending with a fresh attempt budget; None if the job is not dead-lettered."""
    row = (await conn.execute(MANUAL_RETRY, {"job_id": job_id})).mappings().first()
    return _job(row) if row is not None else None
