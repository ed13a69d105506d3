"""Every job statement, one SQLAlchemy Core construct per store operation.

Each operation is a single statement, so it applies atomically or not at all.
Guards and targets come from `jobcore.states.Operation`; outcome writes are
batched (`UPDATE ... FROM unnest(ids, tokens)`) and fenced by the lease token,
and return the leases they applied to. All times come from the database clock.

The API's calls (submit, submit_many, get, manual_retry, notify) run here on a
SQLAlchemy connection; the worker's statements are run by `jobcore.compiled`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.ext.asyncio import AsyncConnection

from jobcore.errors import IdempotencyConflict
from jobcore.schema import jobs
from jobcore.states import ATTEMPT_OUTCOMES, FINISHED, Operation, Status, out_of_attempts

c = jobs.c

# Workers LISTEN on this channel; a notification is only a hint that jobs are
# due, so polling stays correct when one is lost.
NOTIFY_CHANNEL = "jobqueue_jobs"
# The API's waiters LISTEN on this one: a write that finishes a job someone waits for
# (`awaited`) sends its id.
FINISHED_CHANNEL = "jobqueue_finished"
_ONE_SECOND: Any = sa.literal_column("interval '1 second'")


def status_literal(status: Status) -> Any:
    """A status as an SQL literal, never a parameter: the planner must see
    `status = 'pending'` to use the partial indexes, also in generic plans."""
    return sa.literal_column(f"'{status.value}'", sa.Text)


def status_in(statuses: Any) -> Any:
    """`status IN (...)` with literals, in a stable order."""
    return c.status.in_([status_literal(status) for status in sorted(statuses)])


def guard(operation: Operation) -> Any:
    """`status = '<from>'` (or `IN (...)`) for the statuses `operation` may start from."""
    sources = sorted(operation.sources)
    if len(sources) == 1:
        return c.status == status_literal(sources[0])
    return c.status.in_([status_literal(status) for status in sources])


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
    # Where it stood in claim order, for the claiming process's floors (`jobcore.floors`).
    priority: int
    run_at: datetime

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
    # The submitting span's W3C trace context, when tracing is on (docs/operations.md).
    traceparent: str | None = None


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
    result: Any
    cancel_requested_at: datetime | None
    finished_at: datetime | None


JOB_COLUMNS = [jobs.c[name] for name in Job.__dataclass_fields__]


def job_from_row(row: Any) -> Job:
    values = {name: row[name] for name in Job.__dataclass_fields__}
    values["status"] = Status.read(values["status"])
    return Job(**values)


# --- submit ---------------------------------------------------------------


def _conflict_target(insert: Any) -> Any:
    return insert.on_conflict_do_update(
        index_elements=[c.idempotency_key],
        index_where=c.idempotency_key.isnot(None),
        # A no-op update that locks and returns the existing row, even when it was
        # inserted by a concurrent transaction this statement's snapshot cannot see.
        set_={"idempotency_key": insert.excluded.idempotency_key},
        # The same request: when it is due (run_at, delay) is not compared, so a request
        # repeated with a relative delay is still a replay.
        where=sa.and_(
            c.type == insert.excluded.type,
            c.payload == insert.excluded.payload,
            c.max_attempts == insert.excluded.max_attempts,
            c.queue == insert.excluded.queue,
            c.priority == insert.excluded.priority,
            c.timeout.is_not_distinct_from(insert.excluded.timeout),
        ),
    )


def _due_at(not_before: Any, delay: Any) -> Any:
    """When a new job is due, on the database's clock: `not_before` (a time) or `delay`
    seconds from now, never before now()."""
    return sa.func.greatest(
        sa.func.now() + sa.func.coalesce(delay, 0.0) * _ONE_SECOND,
        sa.func.coalesce(not_before, sa.literal_column("'-infinity'::timestamptz")),
    )


_CREATED: Any = sa.literal_column("(xmax = 0)").label("created")
# Parameters are not named after columns (SQLAlchemy would add those columns to the
# statement): `not_before` stands for run_at.
_insert_one = pg.insert(jobs).values(
    id=sa.bindparam("id", type_=pg.UUID(as_uuid=True)),
    type=sa.bindparam("type", type_=sa.Text),
    payload=sa.bindparam("payload", type_=pg.JSONB(none_as_null=False)),
    max_attempts=sa.bindparam("max_attempts", type_=sa.Integer),
    idempotency_key=sa.bindparam("idempotency_key", type_=sa.Text),
    queue=sa.bindparam("queue", type_=sa.Text),
    priority=sa.bindparam("priority", type_=sa.SmallInteger),
    timeout=sa.bindparam("timeout", type_=sa.Float),
    traceparent=sa.bindparam("traceparent", type_=sa.Text),
    run_at=_due_at(
        sa.bindparam("not_before", type_=sa.DateTime(timezone=True)),
        sa.bindparam("delay", type_=sa.Float),
    ),
)
SUBMIT = _conflict_target(_insert_one).returning(*JOB_COLUMNS, _CREATED)

# The same, plus a NOTIFY when a job was created: it is delivered when the insert
# commits, so an idle worker can start the job (or learn when the next one is due)
# before the submitter hears back.
_submitted = _conflict_target(_insert_one).returning(*JOB_COLUMNS, _CREATED).cte("submitted")
SUBMIT_AND_NOTIFY = sa.select(
    _submitted,
    sa.case(
        (
            _submitted.c.created,
            sa.func.pg_notify(sa.literal_column(f"'{NOTIFY_CHANNEL}'"), sa.literal_column("''")),
        )
    ).label("notified"),
)


def submit_params(new: NewJob, payload: Any) -> dict[str, Any]:
    """SUBMIT's (and SUBMIT_AND_NOTIFY's) parameters; `payload` as the driver takes it (the
    value for SQLAlchemy's JSONB type, JSON text for a raw asyncpg call)."""
    return {
        "id": new.id,
        "type": new.type,
        "payload": payload,
        "max_attempts": new.max_attempts,
        "idempotency_key": new.idempotency_key,
        "queue": new.queue,
        "priority": new.priority,
        "timeout": new.timeout,
        "traceparent": new.traceparent,
        "not_before": new.run_at,
        "delay": new.delay,
    }


async def submit(conn: AsyncConnection, new: NewJob, *, notify: bool = False) -> tuple[Job, bool]:
    """Insert a job, or return the job already bound to its idempotency key.

    Returns (job, created). Raises IdempotencyConflict when the key is bound to a
    different type, payload (compared as jsonb), max_attempts, queue, priority or
    timeout. With `notify`, a created job also wakes listening workers (at commit).
    """
    statement = SUBMIT_AND_NOTIFY if notify else SUBMIT
    row = (await conn.execute(statement, submit_params(new, new.payload))).mappings().first()
    if row is None:
        assert new.idempotency_key is not None
        raise IdempotencyConflict(new.idempotency_key)
    return job_from_row(row), bool(row["created"])


# One array parameter per column of the batch: column -> (parameter, type).
_MANY_COLUMNS: dict[str, tuple[str, Any]] = {
    "id": ("ids", pg.UUID(as_uuid=True)),
    "type": ("types", sa.Text),
    "payload": ("payloads", sa.Text),
    "max_attempts": ("max_attempts", sa.Integer),
    "key": ("keys", sa.Text),
    "queue": ("queues", sa.Text),
    "priority": ("priorities", sa.SmallInteger),
    "timeout": ("timeouts", sa.Float),
    "traceparent": ("traceparents", sa.Text),
    "not_before": ("not_befores", sa.DateTime(timezone=True)),
    "delay": ("delays", sa.Float),
}
_many = (
    sa.func.unnest(
        *(sa.bindparam(param, type_=pg.ARRAY(type_)) for param, type_ in _MANY_COLUMNS.values())
    )
    .table_valued(*(sa.column(name, type_) for name, (_, type_) in _MANY_COLUMNS.items()))
    .render_derived(name="b")
)
_MANY_INTO = [
    "id",
    "type",
    "payload",
    "max_attempts",
    "idempotency_key",
    "queue",
    "priority",
    "timeout",
    "traceparent",
    "run_at",
]
_many_rows = sa.select(
    _many.c.id,
    _many.c.type,
    sa.cast(_many.c.payload, pg.JSONB),
    _many.c.max_attempts,
    _many.c.key,
    _many.c.queue,
    _many.c.priority,
    _many.c.timeout,
    _many.c.traceparent,
    _due_at(_many.c.not_before, _many.c.delay),
)
# A batch leaves a job its key already names untouched (DO NOTHING), and returns only the
# rows it created: unlike `_conflict_target`'s no-op update, it takes no lock on an existing
# job, so a replay inside a caller's open transaction (transactional enqueue) cannot hold
# up that job's heartbeats and outcome writes until the caller commits. The replays are
# then read and compared (`keys_to_compare`, GET_BY_KEYS or SAME_REQUESTS) by a statement of
# their own, which sees a job a concurrent transaction committed while this one waited.
SUBMIT_MANY = (
    pg.insert(jobs)
    .from_select(
        _MANY_INTO,
        # Concurrent batches sharing keys take the key locks in the same order,
        # so they wait for each other instead of deadlocking.
        _many_rows.order_by(_many.c.key),
    )
    .on_conflict_do_nothing(
        index_elements=[c.idempotency_key], index_where=c.idempotency_key.isnot(None)
    )
    .returning(c.id, c.idempotency_key, _CREATED)
)
# For each item whose key names a stored job: that job's id and whether it holds the same
# request (compared as `_conflict_target` compares, payloads as jsonb); SUBMIT_MANY's
# parameters. For callers whose driver does not decode jsonb (transactional enqueue).
SAME_REQUESTS = sa.select(
    c.id,
    c.idempotency_key,
    sa.and_(
        c.type == _many.c.type,
        c.payload == sa.cast(_many.c.payload, pg.JSONB),
        c.max_attempts == _many.c.max_attempts,
        c.queue == _many.c.queue,
        c.priority == _many.c.priority,
        c.timeout.is_not_distinct_from(_many.c.timeout),
    ).label("same"),
).select_from(_many.join(jobs, c.idempotency_key == _many.c.key))
# A batch in which no item has an idempotency key: nothing can conflict (each id is new),
# so no arbiter, no sort and nothing returned, a sixth less work for the database. And a
# column whose value every item shares (the type, the queue, ...: most batches) is sent once,
# as `shared_<column>`, its array NULL: the driver encodes two arrays a job instead of
# eleven (docs/performance.md#client). `keyless_params` builds the parameters.
_SHARED: dict[str, tuple[str, str, Any]] = {
    # column -> (its array, its shared value, the NewJob field)
    "type": ("types", "shared_type", "type"),
    "max_attempts": ("max_attempts", "shared_max_attempts", "max_attempts"),
    "queue": ("queues", "shared_queue", "queue"),
    "priority": ("priorities", "shared_priority", "priority"),
    "timeout": ("timeouts", "shared_timeout", "timeout"),
    "traceparent": ("traceparents", "shared_traceparent", "traceparent"),
    "not_before": ("not_befores", "shared_not_before", "run_at"),
    "delay": ("delays", "shared_delay", "delay"),
}
_keyless = (
    sa.func.unnest(
        *(
            sa.bindparam(_MANY_COLUMNS[name][0], type_=pg.ARRAY(_MANY_COLUMNS[name][1]))
            for name in ("id", "payload", *_SHARED)
        )
    )
    .table_valued(
        *(sa.column(name, _MANY_COLUMNS[name][1]) for name in ("id", "payload", *_SHARED))
    )
    .render_derived(name="b")
)


def _shared(name: str) -> Any:
    """The column's value: the item's, else the batch's shared one."""
    return sa.func.coalesce(
        _keyless.c[name], sa.bindparam(_SHARED[name][1], type_=_MANY_COLUMNS[name][1])
    )


SUBMIT_MANY_KEYLESS = pg.insert(jobs).from_select(
    _MANY_INTO,
    sa.select(
        _keyless.c.id,
        _shared("type"),
        sa.cast(_keyless.c.payload, pg.JSONB),
        _shared("max_attempts"),
        sa.null(),
        _shared("queue"),
        _shared("priority"),
        _shared("timeout"),
        _shared("traceparent"),
        _due_at(_shared("not_before"), _shared("delay")),
    ),
)


# Concurrent single submits without a key, sent by one API process as one statement
# (docs/api.md#submit-groups): SUBMIT_MANY_KEYLESS, returning each job, since each request
# answers with its own. With a NOTIFY, sent once for the group (delivered at commit).
SUBMIT_GROUP = SUBMIT_MANY_KEYLESS.returning(*JOB_COLUMNS)
_grouped = SUBMIT_GROUP.cte("grouped")
SUBMIT_GROUP_AND_NOTIFY = sa.select(
    _grouped,
    sa.select(sa.func.pg_notify(sa.literal_column(f"'{NOTIFY_CHANNEL}'"), sa.literal_column("''")))
    .scalar_subquery()
    .label("notified"),
)


def many_params(rows: Sequence[NewJob], payloads: Sequence[str]) -> dict[str, list[Any]]:
    """SUBMIT_MANY's parameters: one array per column, the payloads as JSON text."""
    return {
        "ids": [new.id for new in rows],
        "types": [new.type for new in rows],
        "payloads": list(payloads),
        "max_attempts": [new.max_attempts for new in rows],
        "keys": [new.idempotency_key for new in rows],
        "queues": [new.queue for new in rows],
        "priorities": [new.priority for new in rows],
        "timeouts": [new.timeout for new in rows],
        "traceparents": [new.traceparent for new in rows],
        "not_befores": [new.run_at for new in rows],
        "delays": [new.delay for new in rows],
    }


_FIELD_INDEX = {field: NewJob._fields.index(field) for field in NewJob._fields}


def keyless_params(rows: Sequence[NewJob], payloads: Sequence[str]) -> dict[str, Any]:
    """SUBMIT_MANY_KEYLESS's parameters for `rows` (none with an idempotency key)."""
    fields = list(zip(*rows, strict=True))  # one tuple per NewJob field
    params: dict[str, Any] = {"ids": list(fields[0]), "payloads": list(payloads)}
    for array, shared, name in _SHARED.values():
        values = fields[_FIELD_INDEX[name]]
        first = values[0]
        # Equal values are the same column value: validation gives each field one type
        # (no bools for integers, times in UTC).
        if values.count(first) == len(values):
            params[array], params[shared] = None, first
        else:
            params[array], params[shared] = list(values), None
    return params


class Submitted(NamedTuple):
    """One item's result in `submit_many`: created, replayed or conflict (job_id None)."""

    result: str
    job_id: UUID | None


def same_request(a: NewJob, b: NewJob) -> bool:
    """What the idempotency comparison compares (not when the job is due)."""
    return (a.type, a.max_attempts, a.queue, a.priority, a.timeout, _canonical(a.payload)) == (
        b.type,
        b.max_attempts,
        b.queue,
        b.priority,
        b.timeout,
        _canonical(b.payload),
    )


def _canonical(value: Any) -> Any:
    """A form that compares like jsonb: key order ignored, true distinct from 1."""
    if isinstance(value, dict):
        return ("o", frozenset((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("a", tuple(_canonical(v) for v in value))
    if isinstance(value, bool) or value is None:
        return ("l", value)
    return ("v", value)


def batch_rows(new_jobs: Sequence[NewJob]) -> tuple[list[NewJob], dict[str, NewJob]]:
    """What a batch inserts: every item without an idempotency key and the first item of
    each key (later ones are replays of it or conflicts); and those first items by key."""
    first: dict[str, NewJob] = {}
    rows: list[NewJob] = []
    for new in new_jobs:
        key = new.idempotency_key
        if key is None or key not in first:
            rows.append(new)
            if key is not None:
                first[key] = new
    return rows, first


def returned_by_key(returned: Iterable[Sequence[Any]]) -> dict[str, tuple[UUID, bool]]:
    """SUBMIT_MANY's rows (id, idempotency_key, created): each key's job and whether this
    statement created it."""
    return {row[1]: (row[0], bool(row[2])) for row in returned if row[1] is not None}


def keys_to_compare(first: Mapping[str, NewJob], by_key: Mapping[str, Any]) -> list[str]:
    """Keys for which SUBMIT_MANY returned no row: each names a job stored before (its
    first item and any later ones are replays of it, or conflicts), so that job is read
    (GET_BY_KEYS) and compared."""
    return sorted(key for key in first if key not in by_key)


def stored_requests(rows: Iterable[Sequence[Any]]) -> dict[str, NewJob]:
    """GET_BY_KEYS's rows as the requests they stored, by key."""
    return {
        key: NewJob(job_id, job_type, payload, max_attempts, key, queue, priority, timeout=timeout)
        for job_id, job_type, payload, max_attempts, key, queue, priority, timeout in rows
    }


def batch_results(
    new_jobs: Sequence[NewJob],
    first: Mapping[str, NewJob],
    by_key: Mapping[str, tuple[UUID, bool]],
    stored: Mapping[str, NewJob],
) -> list[Submitted]:
    """Each item's result, in input order: created, replayed or conflict."""
    out: list[Submitted] = []
    for new in new_jobs:
        key = new.idempotency_key
        if key is None:
            out.append(Submitted("created", new.id))
        elif key in by_key and same_request(new, first[key]):
            job_id, created = by_key[key]
            fresh = created and first[key] is new
            out.append(Submitted("created" if fresh else "replayed", job_id))
        elif key in stored and same_request(new, stored[key]):
            out.append(Submitted("replayed", stored[key].id))
        else:
            out.append(Submitted("conflict", None))
    return out


async def submit_many(conn: AsyncConnection, new_jobs: Sequence[NewJob]) -> list[Submitted]:
    """Insert many jobs in one statement; results in input order.

    Idempotency works as in `submit`. An idempotency key repeated inside the
    batch behaves as if the items were sent one after another: the first one
    decides, later ones are replays of it or conflicts. (The API runs the same steps on
    asyncpg: jobqueue_api.calls.submit_many.)
    """
    if not new_jobs:  # SUBMIT_MANY_KEYLESS's shared values need a first item
        return []
    rows, first = batch_rows(new_jobs)
    payloads = [json.dumps(new.payload) for new in rows]
    if not first:
        await conn.execute(SUBMIT_MANY_KEYLESS, keyless_params(rows, payloads))
        return [Submitted("created", new.id) for new in new_jobs]
    by_key = returned_by_key(await conn.execute(SUBMIT_MANY, many_params(rows, payloads)))
    keys = keys_to_compare(first, by_key)
    stored = stored_requests(await conn.execute(GET_BY_KEYS, {"keys": keys})) if keys else {}
    return batch_results(new_jobs, first, by_key, stored)


GET_BY_KEYS = sa.select(
    c.id, c.type, c.payload, c.max_attempts, c.idempotency_key, c.queue, c.priority, c.timeout
).where(c.idempotency_key == sa.any_(sa.bindparam("keys", type_=pg.ARRAY(sa.Text))))


# --- reads ----------------------------------------------------------------

GET = sa.select(*JOB_COLUMNS).where(c.id == sa.bindparam("id"))


async def get(conn: AsyncConnection, job_id: UUID) -> Job | None:
    row = (await conn.execute(GET, {"id": job_id})).mappings().first()
    return job_from_row(row) if row is not None else None


# --- admission (the API's MAX_PENDING) ----------------------------------------
#
# Pending jobs per capped queue, due or not, each count stopping at the queue's cap (a
# queue holding millions costs no more than one at its cap). Index-only reads of
# `jobs_claim_queue_idx`, which holds exactly the pending rows, queue first: the listed
# queues, and with a cap for every other queue (`others`), each queue present among the
# pending jobs, found as a loose index scan (one probe per queue).
PENDING_DEPTHS = sa.text(
    f"""
WITH RECURSIVE present(queue) AS (
    (SELECT queue FROM jobs WHERE status = {status_literal(Status.PENDING)}
       AND CAST(:others AS bigint) IS NOT NULL
     ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT queue FROM jobs WHERE status = {status_literal(Status.PENDING)}
              AND queue > present.queue ORDER BY queue LIMIT 1)
    FROM present WHERE present.queue IS NOT NULL
), capped(queue, cap) AS (
    SELECT * FROM unnest(CAST(:queues AS text[]), CAST(:caps AS bigint[]))
    UNION ALL
    SELECT queue, CAST(:others AS bigint) FROM present
    WHERE queue IS NOT NULL AND queue <> ALL(CAST(:queues AS text[]))
)
SELECT capped.queue, (
    SELECT count(*) FROM (
        SELECT 1 FROM jobs
        WHERE status = {status_literal(Status.PENDING)} AND jobs.queue = capped.queue
        LIMIT capped.cap
    ) AS p
) AS pending
FROM capped"""
)


async def pending_depths(
    conn: AsyncConnection, caps: dict[str, int], others: int | None
) -> dict[str, int]:
    """Pending jobs of each capped queue (at most its cap); queues holding none may be absent."""
    rows = await conn.execute(
        PENDING_DEPTHS, {"queues": list(caps), "caps": list(caps.values()), "others": others}
    )
    return {row.queue: row.pending for row in rows}


EXISTING_KEYS = sa.select(c.idempotency_key).where(
    c.idempotency_key == sa.any_(sa.bindparam("keys", type_=pg.ARRAY(sa.Text)))
)


async def existing_keys(conn: AsyncConnection, keys: set[str]) -> set[str]:
    """Those of `keys` that name a stored job."""
    rows = await conn.execute(EXISTING_KEYS, {"keys": sorted(keys)})
    return {row.idempotency_key for row in rows}


# --- the worker's statements ------------------------------------------------
#
# Constructs only: the worker runs them through `jobcore.compiled`, and so do the
# tests, so every transition test exercises the path production takes.

# The claim order, per queue: priority descending, then run_at, then id, among due jobs.
# `jobs_claim_queue_idx` holds pending jobs in that order, but a plain `run_at <= now()`
# filter on it would read past every job not yet due at a higher priority (each claim,
# each poll). So the claim walks it as a loose index scan: the priorities present among a
# queue's pending jobs, highest first (one index probe each, a recursive CTE), and for each
# the due jobs in run_at order (a range read that stops at the first job not yet due),
# until it has as many as that queue's free slots. Guards are literals from the
# declaration, as everywhere (the planner must see them to use the partial index).
#
# Both reads start past what the claiming process already took (`jobcore.floors`): the
# priorities it knows, each with its floor (`known`: parameters `floor_queues`,
# `floor_priorities`, `floors`), are read from their floor, and only the gaps between them
# are probed for priorities it does not know yet. Without floors (a sweep) this is the
# plain loose index scan from the head. The dead entries a held MVCC horizon keeps in the
# index lie below the floors, so no claim but a sweep reads them.
(_CLAIMABLE,) = Operation.CLAIM.sources
_PENDING = f"'{_CLAIMABLE.value}'"
_NO_PRIORITY = -32768  # below every priority: "no known priority below this one"
_KNOWN = """
    known(p, f) AS (
        SELECT k.p, k.f FROM unnest(CAST(:floor_queues AS text[]),
                                    CAST(:floor_priorities AS smallint[]),
                                    CAST(:floors AS timestamptz[])) AS k(q, p, f)
        WHERE k.q = w.queue
    )"""


def _next_priority(above: str, known_below: str) -> str:
    """The next priority present below `above` (SQL, NULL: the top): the highest pending
    one in the gap down to the next known priority, else that known priority."""
    bound = f" AND priority < {above}" if above else ""
    return f"""coalesce(
            (SELECT priority FROM jobs
             WHERE status = {_PENDING} AND queue = w.queue{bound}
               AND priority > (SELECT coalesce(max(known.p), {_NO_PRIORITY}) FROM known
                               {known_below})
             ORDER BY priority DESC LIMIT 1),
            (SELECT max(known.p) FROM known {known_below}))"""


_PRIORITIES = f"""
    WITH RECURSIVE {_KNOWN.strip()}, priorities(p) AS (
        SELECT {_next_priority("", "")}
        UNION ALL
        SELECT {_next_priority("priorities.p", "WHERE known.p < priorities.p")}
        FROM priorities WHERE priorities.p IS NOT NULL
    )"""
_FLOOR = (
    "coalesce((SELECT known.f FROM known WHERE known.p = priorities.p),"
    " CAST('-infinity' AS timestamptz))"
)


def _due_jobs(skip: str) -> Any:
    """The jobs a claim takes; `skip` is a further condition on them ("" for none)."""
    return (
        sa.text(
            f"""
SELECT j.id FROM unnest(CAST(:queues AS text[]), CAST(:slots AS integer[])) AS w(queue, n)
CROSS JOIN LATERAL ({_PRIORITIES}
    SELECT d.id FROM priorities CROSS JOIN LATERAL (
        SELECT id FROM jobs
        WHERE status = {_PENDING} AND queue = w.queue AND priority = priorities.p
          AND run_at >= {_FLOOR} AND run_at <= now(){skip}
        ORDER BY run_at, id LIMIT w.n FOR UPDATE SKIP LOCKED
    ) AS d
    LIMIT w.n
) AS j"""
        )
        .columns(sa.column("id", pg.UUID(as_uuid=True)))
        .cte("due")
        .prefix_with("MATERIALIZED")
    )


# The rows `due` locked are pending and stay so until the statement ends (nobody else
# can change a locked row), so the UPDATE finds them by id alone. Testing the status
# again here would let the planner reach them through the claim index instead, which it
# may take for nearly empty (statistics from a quiet moment): every pending job read per
# claimed one, 100s of ms per claim with 20,000 waiting. `= ANY(ARRAY(...))` keeps the
# lookup on the primary key in generic plans too, whatever the statistics say.
def _claim(due: Any) -> Any:
    return (
        sa.update(jobs)
        .where(c.id == sa.any_(sa.func.array(sa.select(due.c.id).scalar_subquery())))
        .values(
            status=status_literal(Status.PROCESSING),
            attempts=c.attempts + 1,
            lease_token=c.lease_token + 1,
            locked_until=sa.func.now()
            + sa.bindparam("lease_seconds", type_=sa.Float) * _ONE_SECOND,
            # Not named after the column: SQLAlchemy would add `SET claim_id` to every UPDATE of
            # a statement whose parameters hold a column's name.
            claim_id=sa.bindparam("claim", type_=pg.UUID(as_uuid=True)),
            updated_at=sa.func.now(),
        )
        .returning(*(c[name] for name in Claimed.__dataclass_fields__))
    )


CLAIM = _claim(_due_jobs(""))

# Seconds until the earliest pending job of these queues that is not due yet (NULL: none),
# so an idle worker can wake for it instead of polling fast: per queue and priority, the
# first entry past now() in the claim index. The priorities are found as the claim finds
# them, from the same floors.
NEXT_DUE = sa.text(
    f"""
SELECT EXTRACT(EPOCH FROM min(n.run_at) - now())::float8 AS seconds
FROM unnest(CAST(:queues AS text[])) AS w(queue)
CROSS JOIN LATERAL ({_PRIORITIES}
    SELECT (SELECT run_at FROM jobs
            WHERE status = {_PENDING} AND queue = w.queue AND priority = priorities.p
              AND run_at > now()
            ORDER BY run_at LIMIT 1) AS run_at
    FROM priorities WHERE priorities.p IS NOT NULL
) AS n"""
).columns(sa.column("seconds", sa.Float))


# Per queue and priority present, the earliest due pending job's run_at, found from the
# head of the claim index (without floors: `known` empty), locking nothing: what a process
# checks its floors against now and then, off the claims' path (`jobcore.floors`). Under a
# held MVCC horizon it reads every dead entry, as a claim from the head would.
CLAIM_HEADS = sa.text(
    f"""
SELECT w.queue, h.p AS priority, h.run_at
FROM unnest(CAST(:queues AS text[])) AS w(queue)
CROSS JOIN LATERAL ({_PRIORITIES}
    SELECT priorities.p, (SELECT run_at FROM jobs
                          WHERE status = {_PENDING} AND queue = w.queue
                            AND priority = priorities.p AND run_at <= now()
                          ORDER BY run_at, id LIMIT 1) AS run_at
    FROM priorities WHERE priorities.p IS NOT NULL
) AS h
WHERE h.run_at IS NOT NULL"""
).columns(
    sa.column("queue", sa.Text),
    sa.column("priority", sa.SmallInteger),
    sa.column("run_at", sa.DateTime(timezone=True)),
)


def _unnest(**arrays: tuple[str, Any]) -> Any:
    """`unnest(:ids, :tokens, ...) AS o(id, token, ...)`: one row per job in the batch."""
    params = [sa.bindparam(param, type_=pg.ARRAY(type_)) for param, type_ in arrays.values()]
    columns = [sa.column(name, type_) for name, (_, type_) in arrays.items()]
    return sa.func.unnest(*params).table_valued(*columns).render_derived(name="o")


_LEASES = {"id": ("ids", pg.UUID(as_uuid=True)), "token": ("tokens", sa.BigInteger)}
_ERRORS = {"error": ("errors", sa.Text)}
_DELAYS = {"delay": ("delays", sa.Float)}
_RESULTS = {"result": ("results", sa.Text)}


def _finish_time(status: Any) -> Any:
    """finished_at for a row whose new status is `status` (a column or an expression)."""
    return sa.case((status.in_([status_literal(s) for s in sorted(FINISHED)]), sa.func.now()))


# Evaluated per row a write returns, with the row's new values: the id of a job that just
# finished, for the API's waiters, only when someone waits for it (`awaited`); no
# notification otherwise, so finishing costs nothing when nobody waits.
WOKE: Any = sa.case(
    (
        sa.and_(c.awaited, status_in(FINISHED)),
        sa.func.pg_notify(sa.literal_column(f"'{FINISHED_CHANNEL}'"), sa.cast(c.id, sa.Text)),
    )
).label("woke")


def _unless_cancelled(target: Status) -> Any:
    """`target`, or `cancelled` when a cancel was requested: a job whose holder lets it go
    (to run again later) must not run again after an operator cancelled it."""
    return sa.case(
        (c.cancel_requested_at.is_not(None), status_literal(Status.CANCELLED)),
        else_=status_literal(target),
    )


def _fenced(operation: Operation, o: Any, **values: Any) -> Any:
    """Apply `operation` to each (id, token) whose lease is still the current one; returns
    the (id, token) of each row it applied to."""
    targets = operation.targets
    finished: Any
    if len(targets) == 1:
        (target,) = targets
        status = status_literal(target)
        finished = sa.func.now() if target in FINISHED else sa.null()
    else:
        (target,) = targets - {Status.CANCELLED}
        status = _unless_cancelled(target)
        finished = sa.case((c.cancel_requested_at.is_not(None), sa.func.now()))
    return (
        sa.update(jobs)
        .where(c.id == o.c.id, guard(operation), c.lease_token == o.c.token)
        .values(
            status=status,
            locked_until=sa.null(),
            finished_at=finished,
            updated_at=sa.func.now(),
            **values,
        )
        .returning(c.id, c.lease_token, WOKE)
    )


_o = _unnest(**_LEASES)
_or = _unnest(**_LEASES, **_RESULTS)
_oe = _unnest(**_LEASES, **_ERRORS)
_od = _unnest(**_LEASES, **_DELAYS)
_oed = _unnest(**_LEASES, **_ERRORS, **_DELAYS)

# Outcome writes, batched and fenced; parameters `ids` and `tokens`, and `results` (JSON
# text, NULL for None), `errors` and `delays` (seconds until the job is due again) where
# the statement uses them.
OUTCOME_WRITES: dict[Operation, Any] = {
    Operation.COMPLETE: _fenced(
        Operation.COMPLETE, _or, last_error=sa.null(), result=sa.cast(_or.c.result, pg.JSONB)
    ),
    Operation.FAIL: _fenced(Operation.FAIL, _oe, last_error=_oe.c.error),
    Operation.DEAD_LETTER: _fenced(Operation.DEAD_LETTER, _oe, last_error=_oe.c.error),
    Operation.CANCEL_ATTEMPT: _fenced(Operation.CANCEL_ATTEMPT, _o),
    Operation.RETRY_LATER: _fenced(
        Operation.RETRY_LATER,
        _oed,
        last_error=_oed.c.error,
        run_at=sa.func.now() + _oed.c.delay * _ONE_SECOND,
    ),
    Operation.SNOOZE: _fenced(
        Operation.SNOOZE,
        _od,
        attempts=c.attempts - 1,
        run_at=sa.func.now() + _od.c.delay * _ONE_SECOND,
    ),
    Operation.RELEASE: _fenced(Operation.RELEASE, _o, attempts=c.attempts - 1),
}
if set(OUTCOME_WRITES) != set(ATTEMPT_OUTCOMES):
    raise RuntimeError("every operation that ends an attempt needs its outcome write")

# Heartbeats: the leases of running attempts extended by `lease_seconds` from now(), fenced
# like an outcome write. Each row is one the statement found (id, token, whether a cancel
# was requested, in case the announcement never reached the holder) and whether it was
# renewed: a row another transaction holds locked (an operator's `SELECT ... FOR UPDATE`, a
# replay of the job's idempotency key in an open transaction) is skipped, not waited for,
# so one locked row cannot cost every other lease of the batch its renewal; its lease keeps
# its time, and the next heartbeat tries again. A lease it does not return at all was lost
# (expired and recovered, or re-claimed), and its attempt must stop.
_renewable = sa.select(c.id, c.lease_token).where(
    c.id == _o.c.id, guard(Operation.RENEW), c.lease_token == _o.c.token
)
_unlocked = _renewable.with_for_update(of=jobs, skip_locked=True).cte("unlocked")
_renewed = (
    sa.update(jobs)
    .where(
        c.id == _unlocked.c.id,
        guard(Operation.RENEW),
        c.lease_token == _unlocked.c.lease_token,
    )
    .values(
        locked_until=sa.func.now() + sa.bindparam("lease_seconds", type_=sa.Float) * _ONE_SECOND
    )
    .returning(c.id)
    .cte("renewed")
)
_held = _renewable.add_columns(c.cancel_requested_at.is_not(None).label("cancel")).cte("held")
RENEW = sa.select(
    _held.c.id,
    _held.c.lease_token,
    _held.c.cancel,
    _renewed.c.id.is_not(None).label("renewed"),
).select_from(_held.outerjoin(_renewed, _renewed.c.id == _held.c.id))

# A claim whose answer never reached its worker (the call timed out or its connection
# broke after the statement was sent) may still have committed: the jobs it took are
# handed back, attempt given back, by the claim's id. Nobody else can hold them: only
# that claim set this id, and a later claim would have replaced it.
RELEASE_CLAIM = (
    sa.update(jobs)
    .where(
        guard(Operation.RELEASE_CLAIM),
        c.claim_id == sa.any_(sa.bindparam("claim_ids", type_=pg.ARRAY(pg.UUID(as_uuid=True)))),
    )
    .values(
        status=_unless_cancelled(Status.PENDING),
        attempts=c.attempts - 1,
        locked_until=sa.null(),
        finished_at=sa.case((c.cancel_requested_at.is_not(None), sa.func.now())),
        updated_at=sa.func.now(),
    )
    .returning(c.id, WOKE)
)

# COMPLETE and CLAIM in one statement, so a worker refills the slots its completed jobs
# free with the same round trip and commit (WAL flush) that records them. Each transition
# is still its own guarded UPDATE. COMPLETE runs first (the first branch is read first);
# CLAIM never waits (SKIP LOCKED), so while the statement waits for a lock it holds no
# lock of its claim. Both see one snapshot: CLAIM cannot see what COMPLETE changed, and
# needs not (a job it completes is not pending). Rows: (True, id and lease_token of a
# completed job, NULLs between) or (False, the columns of a claimed job, as CLAIM returns
# them).
_done = OUTCOME_WRITES[Operation.COMPLETE].cte("done")
_CLAIMED_COLUMNS = [name for name in Claimed.__dataclass_fields__ if name != "id"]


def _complete_and_claim(claim: Any) -> Any:
    claimed = claim.cte("claimed")
    return sa.union_all(
        sa.select(
            sa.true().label("completed"),
            _done.c.id,
            *(
                _done.c.lease_token if name == "lease_token" else sa.cast(sa.null(), c[name].type)
                for name in _CLAIMED_COLUMNS
            ),
        ),
        sa.select(sa.false(), claimed.c.id, *(claimed.c[name] for name in _CLAIMED_COLUMNS)),
    )


COMPLETE_AND_CLAIM = _complete_and_claim(CLAIM)

# --- per-type limits (TYPE_CONCURRENCY, TYPE_RATE) -----------------------------------
#
# With limits configured, the claims above skip the limited types (`:limited`), and those
# are claimed only by CLAIM_LIMITED, in a transaction of its own: LOCK_TYPES first takes a
# transaction-scoped advisory lock per limited type (in key order, so two claimers cannot
# deadlock), then CLAIM_LIMITED, a new statement whose snapshot sees every claim committed
# before the lock, counts what each type has left and claims at most that. Only claimers of
# the same types wait for each other; other types' claims never take the locks.


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


CLAIM_UNLIMITED = _claim(_due_jobs(" AND type <> ALL(CAST(:limited AS text[]))"))
COMPLETE_AND_CLAIM_UNLIMITED = _complete_and_claim(CLAIM_UNLIMITED)

# The same round trip sets, for the transaction only, what CLAIM_LIMITED's plan needs: its
# window functions sort (a worker session turns sorts off, and their penalty in the cost
# would bring in JIT compilation, 100s of ms per claim).
LOCK_TYPES = sa.text(
    """
SELECT set_config('enable_sort', 'on', true) AS sort, set_config('jit', 'off', true) AS jit,
       count(pg_advisory_xact_lock(k)) AS locked
FROM (
    SELECT DISTINCT hashtextextended('jobqueue.type:' || t, 0) AS k
    FROM unnest(CAST(:types AS text[])) AS t
    ORDER BY k
) AS keys"""
).columns(sa.column("sort", sa.Text), sa.column("jit", sa.Text), sa.column("locked", sa.BigInteger))

_PROCESSING = f"'{Status.PROCESSING.value}'"
# One claim for the free slots of every queue, in claim order across limited and other
# types alike (a limited backlog of low priority never takes a slot a higher priority job of
# another type is due for). Per limited type, the jobs it may still start: its concurrency
# limit less its processing jobs (read through the lease index: only leased rows) and less
# its handlers that outlived their recorded attempts in this process (`overruns`: they still
# hold their unit until they return), its rate less what its current window used; NULL
# where it has no such limit. Then the candidates: per queue and limited type, the due jobs
# in claim order (a loose index scan over priorities, as in CLAIM, in
# `jobs_claim_type_idx`), at most what the type has left and the queue's free slots, of
# which at most what each type has left; and per queue, the due jobs of the other types as
# CLAIM reads them (from the floors). Of all candidates, in claim order, at most each
# queue's free slots are taken. The rate windows of the types that started jobs are
# advanced. Rows: a claimed job (columns as CLAIM's, then NULL, NULL), or per limited type
# (id NULL) the type, the limit it reached (`held`, 'rate' or 'concurrency', NULL if none)
# and the seconds until its rate window ends.
CLAIM_LIMITED = sa.text(
    f"""
WITH room AS MATERIALIZED (
    SELECT l.type, l.rate, l.period, r.window_start,
           l.concurrency - l.overrun
           - (SELECT count(*) FROM jobs
              WHERE status = {_PROCESSING} AND type = l.type) AS concurrency_left,
           l.rate - coalesce((SELECT used FROM job_rate_windows AS u
                              WHERE u.type = l.type AND u.window_start = r.window_start),
                             0) AS rate_left
    FROM unnest(CAST(:types AS text[]), CAST(:concurrency AS integer[]),
                CAST(:overruns AS integer[]), CAST(:rates AS integer[]),
                CAST(:periods AS float8[]))
         AS l(type, concurrency, overrun, rate, period)
    CROSS JOIN LATERAL (
        SELECT to_timestamp(floor(extract(epoch FROM statement_timestamp()) / l.period)
                            * l.period) AS window_start
    ) AS r
), due AS MATERIALIZED (
    SELECT d.id, d.priority, d.run_at, room.type, w.queue, w.n AS slots,
           greatest(least(room.concurrency_left, room.rate_left), 0) AS type_left
    FROM room CROSS JOIN unnest(CAST(:queues AS text[]), CAST(:slots AS integer[])) AS w(queue, n)
    CROSS JOIN LATERAL (
        WITH RECURSIVE priorities(p) AS (
            (SELECT priority FROM jobs
             WHERE status = {_PENDING} AND type = room.type AND queue = w.queue
             ORDER BY priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT priority FROM jobs
                    WHERE status = {_PENDING} AND type = room.type AND queue = w.queue
                      AND priority < priorities.p
                    ORDER BY priority DESC LIMIT 1)
            FROM priorities WHERE priorities.p IS NOT NULL
        )
        SELECT j.id, j.priority, j.run_at FROM priorities CROSS JOIN LATERAL (
            SELECT id, priority, run_at FROM jobs
            WHERE status = {_PENDING} AND type = room.type AND queue = w.queue
              AND priority = priorities.p AND run_at <= now()
            ORDER BY run_at, id
            LIMIT greatest(least(room.concurrency_left, room.rate_left, w.n), 0)
            FOR UPDATE SKIP LOCKED
        ) AS j
        LIMIT greatest(least(room.concurrency_left, room.rate_left, w.n), 0)
    ) AS d
), by_type AS (
    SELECT id, priority, run_at, queue, slots,
           row_number() OVER (PARTITION BY type ORDER BY priority DESC, run_at, id) AS nth,
           type_left
    FROM due
), others AS MATERIALIZED (
    SELECT o.id, o.priority, o.run_at, w.queue, w.n AS slots
    FROM unnest(CAST(:queues AS text[]), CAST(:slots AS integer[])) AS w(queue, n)
    CROSS JOIN LATERAL ({_PRIORITIES}
        SELECT d.id, d.priority, d.run_at FROM priorities CROSS JOIN LATERAL (
            SELECT id, priority, run_at FROM jobs
            WHERE status = {_PENDING} AND queue = w.queue AND priority = priorities.p
              AND run_at >= {_FLOOR} AND run_at <= now()
              AND type <> ALL(CAST(:types AS text[]))
            ORDER BY run_at, id LIMIT w.n FOR UPDATE SKIP LOCKED
        ) AS d
        LIMIT w.n
    ) AS o
), by_queue AS (
    SELECT id, slots,
           row_number() OVER (PARTITION BY queue ORDER BY priority DESC, run_at, id) AS nth
    FROM (SELECT id, priority, run_at, queue, slots FROM by_type WHERE nth <= type_left
          UNION ALL
          SELECT id, priority, run_at, queue, slots FROM others) AS candidates
), claimed AS (
    UPDATE jobs SET status = {_PROCESSING}, attempts = attempts + 1,
        lease_token = lease_token + 1,
        locked_until = now() + CAST(:lease_seconds AS float8) * interval '1 second',
        claim_id = CAST(:claim AS uuid), updated_at = now()
    WHERE id = ANY(ARRAY(SELECT id FROM by_queue WHERE nth <= slots))
    RETURNING id, type, payload, attempts, max_attempts, lease_token, queue, timeout,
              traceparent, priority, run_at
), started AS (
    SELECT type, count(*) AS n FROM claimed GROUP BY type
), counted AS (
    INSERT INTO job_rate_windows AS u (type, window_start, used)
    SELECT room.type, room.window_start, started.n
    FROM room JOIN started ON started.type = room.type
    WHERE room.rate IS NOT NULL
    ON CONFLICT (type) DO UPDATE SET
        used = CASE WHEN u.window_start = excluded.window_start
                    THEN u.used + excluded.used ELSE excluded.used END,
        window_start = excluded.window_start
)
SELECT id, type, payload, attempts, max_attempts, lease_token, queue, timeout, traceparent,
       priority, run_at, CAST(NULL AS text) AS held, CAST(NULL AS float8) AS wait
FROM claimed
UNION ALL
SELECT NULL, room.type, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       CASE WHEN room.rate_left - coalesce(started.n, 0) <= 0 THEN 'rate'
            WHEN room.concurrency_left - coalesce(started.n, 0) <= 0 THEN 'concurrency'
       END,
       extract(epoch FROM room.window_start + room.period * interval '1 second'
                          - statement_timestamp())::float8
FROM room LEFT JOIN started ON started.type = room.type"""
).columns(
    sa.column("id", pg.UUID(as_uuid=True)),
    *(sa.column(name, c[name].type) for name in _CLAIMED_COLUMNS),
    sa.column("held", sa.Text),
    sa.column("wait", sa.Float),
)

# At most this many jobs per statement, so that recovery after a long outage stays within
# the worker's statement timeout and holds its row locks briefly; the loop repeats it.
RECOVER_BATCH = 1000
# `window`: only leases that ran out at most that many seconds ago (NULL: any). A lease the
# previous run saw expire it took back, so the worker reads from there (and now and then
# from the head, see `jobcore.floors`): the lease index's dead entries, one per attempt
# that ended while a held MVCC horizon keeps them, lie further back.
_RECENT = sa.func.coalesce(
    sa.func.now() - sa.bindparam("window", type_=sa.Float) * _ONE_SECOND,
    sa.literal_column("CAST('-infinity' AS timestamptz)"),
)
_expired = (
    sa.select(c.id)
    .where(
        guard(Operation.RECOVER_EXPIRED),
        c.locked_until < sa.func.now(),
        c.locked_until >= _RECENT,
    )
    .order_by(c.locked_until)
    .limit(RECOVER_BATCH)
    .with_for_update(skip_locked=True)
    .cte("expired")
    .prefix_with("MATERIALIZED")
)
# A job whose cancel was requested ends cancelled; else it runs again if it has attempts left.
_RECOVERED = sa.case(
    (c.cancel_requested_at.is_not(None), status_literal(Status.CANCELLED)),
    (out_of_attempts(c.attempts, c.max_attempts), status_literal(Status.DEAD_LETTER)),
    else_=status_literal(Status.PENDING),
)
RECOVER_EXPIRED = (
    sa.update(jobs)
    .where(c.id == sa.any_(sa.func.array(sa.select(_expired.c.id).scalar_subquery())))
    .values(
        status=_RECOVERED,
        locked_until=sa.null(),
        last_error=sa.func.concat("lease expired during attempt ", c.attempts),
        finished_at=_finish_time(_RECOVERED),
        updated_at=sa.func.now(),
    )
    .returning(c.id, c.status, WOKE)
)

# Every statement the worker runs, by name.
WORKER_STATEMENTS: dict[str, Any] = {
    Operation.CLAIM: CLAIM,
    "next_due": NEXT_DUE,
    "claim_heads": CLAIM_HEADS,
    **{str(op): statement for op, statement in OUTCOME_WRITES.items()},
    Operation.RELEASE_CLAIM: RELEASE_CLAIM,
    Operation.RECOVER_EXPIRED: RECOVER_EXPIRED,
    Operation.RENEW: RENEW,
    "complete_and_claim": COMPLETE_AND_CLAIM,
    "claim_unlimited": CLAIM_UNLIMITED,
    "complete_and_claim_unlimited": COMPLETE_AND_CLAIM_UNLIMITED,
    "lock_types": LOCK_TYPES,
    "claim_limited": CLAIM_LIMITED,
}


# --- wake-ups -----------------------------------------------------------------

NOTIFY = sa.select(sa.func.pg_notify(sa.literal(NOTIFY_CHANNEL), sa.literal("")))


async def notify(conn: AsyncConnection) -> None:
    """Tell listening workers that jobs are due (delivered when the transaction commits)."""
    await conn.execute(NOTIFY)
