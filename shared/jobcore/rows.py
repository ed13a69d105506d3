"""The rows the statements take and return, as Python values, read by column name.

Pure: no SQL and no I/O (`jobcore.queries` holds the statements)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, Protocol
from uuid import UUID

from jobcore.states import Status


class Row(Protocol):
    """A row as every driver returns it: its columns by name (an asyncpg Record, a
    SQLAlchemy RowMapping, a psycopg dict row)."""

    def __getitem__(self, key: str, /) -> Any: ...


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
    queue: str
    timeout: float | None  # seconds; None: the worker's JOB_TIMEOUT
    traceparent: str | None  # the submitting span's trace context; None: tracing was off
    # Where it stood in claim order, for the claiming process's floors (`jobcore.floors`)
    # and turns (`jobcore.turns`).
    priority: int
    run_at: datetime
    concurrency_key: str | None = None

    @property
    def lease(self) -> Lease:
        return Lease(self.id, self.lease_token)


class NewJob(NamedTuple):
    """A job to submit. `run_at` (a time) or `delay` (seconds from the database's now())
    says when it is due, at the earliest now(); neither: now(). (A NamedTuple, not a
    frozen dataclass: a batch builds one per item, and this is a third of the cost.)"""

    id: UUID
    type: str
    payload: Any
    max_attempts: int
    idempotency_key: str | None = None
    queue: str = "default"
    priority: int = 0
    run_at: datetime | None = None
    delay: float | None = None
    timeout: float | None = None
    # Jobs of one key take turns with other keys' and share the queue's KEY_CONCURRENCY.
    concurrency_key: str | None = None
    # The submitting span's W3C trace context, when tracing is on (docs/operations.md).
    traceparent: str | None = None


@dataclass(frozen=True)
class JobTypeRecord:
    """A type some worker serves (`job_types`): its handler's options as create fields,
    the worker's periodic schedules of it, which worker process recorded it last and when."""

    type: str
    options: dict[str, Any]
    schedules: list[Any]
    recorded_by: str
    recorded_at: datetime


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
    queue: str
    priority: int
    timeout: float | None
    concurrency_key: str | None
    result: Any
    cancel_requested_at: datetime | None
    finished_at: datetime | None
    # The failed attempts (`jobs.errors`, [] for none), read only for the full record
    # (`JOB_GET`); None where the statement did not read them (lists, submits, control).
    errors: list[dict[str, Any]] | None = None
    # The worker process that holds (or last held) the lease, `<host>:<pid>`; read only for
    # the full record, as `errors`.
    leased_by: str | None = None


class Submitted(NamedTuple):
    """One item's result in `submit_many`: created, replayed or conflict (job_id None)."""

    result: str
    job_id: UUID | None


@dataclass(frozen=True)
class TypeLimits:
    """Per job type: at most `concurrency[type]` jobs processing at once, and at most n
    attempts started per fixed window of s seconds (aligned on the database clock), where
    `rate[type] = (n, s)`."""

    concurrency: Mapping[str, int] = field(default_factory=dict)
    rate: Mapping[str, tuple[int, float]] = field(default_factory=dict)

    @property
    def types(self) -> list[str]:
        return sorted({*self.concurrency, *self.rate})


class Renewed(NamedTuple):
    """What a renewal of leases found."""

    lost: list[Lease]  # not renewed: the attempt must stop, its outcome unwritten
    cancel: list[Lease]  # still held, and a cancel of the job was requested
    busy: list[Lease]  # still held, but locked by another transaction: not renewed this time


class LimitedClaim(NamedTuple):
    """What a claim under per-type limits took, and why it may have taken less."""

    jobs: list[Claimed]
    # Type -> the limit it has reached ("rate" or "concurrency"), for each type that has.
    held: dict[str, str]
    # Seconds until the rate window of a type held by its rate ends (the soonest); None: none.
    wait: float | None
    # Type -> the earliest lease of its running jobs the claim counted, or the claim's time,
    # as `jobcore.floors.micros` (where its lease floor may rise to, `floors.TypeFloors`).
    running: dict[str, int]


class TableStats(NamedTuple):
    """One of jobqueue's tables: its dead tuples, and whether autovacuum vacuums it."""

    name: str
    dead: int
    autovacuum: bool


class Moved(NamedTuple):
    """One move of completed jobs to `jobs_history`: how many it moved, and when the newest
    of them finished (None if it moved none)."""

    jobs: int
    newest: datetime | None


# The columns every statement returning a job reads; the full record's adds RECORD_FIELDS.
RECORD_FIELDS = ("errors", "leased_by")
JOB_FIELDS = tuple(name for name in Job.__dataclass_fields__ if name not in RECORD_FIELDS)
CLAIMED_FIELDS = tuple(Claimed.__dataclass_fields__)


def job_from_row(row: Row, *, full: bool = False) -> Job:
    """A job from a row holding (at least) its columns, by name, and with `full` those of
    the full record (`JOB_GET`'s); a status this release does not know is read as it is
    (`Status.read`)."""
    names = JOB_FIELDS + RECORD_FIELDS if full else JOB_FIELDS
    values = {name: row[name] for name in names}
    values["status"] = Status.read(values["status"])
    return Job(**values)


def claimed_from_row(row: Row) -> Claimed:
    """A claimed job from a row holding its columns, by name."""
    return Claimed(*(row[name] for name in CLAIMED_FIELDS))
