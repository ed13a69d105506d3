"""The statements that write new jobs: one (`JOB_SUBMIT`), a batch (`JOB_SUBMIT_MANY`, and
`JOB_SUBMIT_MANY_KEYLESS` when no item has an idempotency key), a group of the API's
coalesced submits (`JOB_SUBMIT_GROUP`), the replays' reads, and their parameters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from jobcore.queries.common import JOB_COLUMNS, NOTIFY_CHANNEL, ONE_SECOND, c
from jobcore.rows import NewJob
from jobcore.schema import jobs

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
            c.concurrency_key.is_not_distinct_from(insert.excluded.concurrency_key),
        ),
    )


def _due_at(not_before: Any, delay: Any) -> Any:
    """When a new job is due, on the database's clock: `not_before` (a time) or `delay`
    seconds from now, never before now()."""
    return sa.func.greatest(
        sa.func.now() + sa.func.coalesce(delay, 0.0) * ONE_SECOND,
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
    concurrency_key=sa.bindparam("concurrency_key", type_=sa.Text),
    traceparent=sa.bindparam("traceparent", type_=sa.Text),
    run_at=_due_at(
        sa.bindparam("not_before", type_=sa.DateTime(timezone=True)),
        sa.bindparam("delay", type_=sa.Float),
    ),
)
JOB_SUBMIT = _conflict_target(_insert_one).returning(*JOB_COLUMNS, _CREATED)

# The same, plus a JOB_NOTIFY when a job was created: it is delivered when the insert
# commits, so an idle worker can start the job (or learn when the next one is due)
# before the submitter hears back.
_submitted = _conflict_target(_insert_one).returning(*JOB_COLUMNS, _CREATED).cte("submitted")
JOB_SUBMIT_NOTIFY = sa.select(
    _submitted,
    sa.case(
        (
            _submitted.c.created,
            sa.func.pg_notify(sa.literal_column(f"'{NOTIFY_CHANNEL}'"), sa.literal_column("''")),
        )
    ).label("notified"),
)


def submit_params(new: NewJob, payload: Any) -> dict[str, Any]:
    """JOB_SUBMIT's (and JOB_SUBMIT_NOTIFY's) parameters; `payload` as the driver takes it (the
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
        "concurrency_key": new.concurrency_key,
        "traceparent": new.traceparent,
        "not_before": new.run_at,
        "delay": new.delay,
    }


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
    "concurrency_key": ("concurrency_keys", sa.Text),
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
    "concurrency_key",
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
    _many.c.concurrency_key,
    _many.c.traceparent,
    _due_at(_many.c.not_before, _many.c.delay),
)
# A batch leaves a job its key already names untouched (DO NOTHING), and returns only the
# rows it created: unlike `_conflict_target`'s no-op update, it takes no lock on an existing
# job, so a replay inside a caller's open transaction (transactional enqueue) cannot hold
# up that job's heartbeats and outcome writes until the caller commits. The replays are
# then read and compared (`idempotency.to_compare`, JOB_MATCH_REQUESTS) by a
# statement of their own, which sees a job a concurrent transaction committed meanwhile.
JOB_SUBMIT_MANY = (
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
# For each item (`item`, its id) whose key names a stored job: that job's id and whether it
# holds the same request, compared in the database as `_conflict_target` compares a single
# submit (payloads as jsonb); JOB_SUBMIT_MANY's parameters.
JOB_MATCH_REQUESTS = sa.select(
    _many.c.id.label("item"),
    c.id,
    c.idempotency_key,
    sa.and_(
        c.type == _many.c.type,
        c.payload == sa.cast(_many.c.payload, pg.JSONB),
        c.max_attempts == _many.c.max_attempts,
        c.queue == _many.c.queue,
        c.priority == _many.c.priority,
        c.timeout.is_not_distinct_from(_many.c.timeout),
        c.concurrency_key.is_not_distinct_from(_many.c.concurrency_key),
    ).label("same"),
).select_from(_many.join(jobs, c.idempotency_key == _many.c.key))
# A batch in which no item has an idempotency key: nothing can conflict (each id is new),
# so no arbiter, no sort and nothing returned, a sixth less work for the database. And a
# column whose value every item shares (the type, the queue, ...: most batches) is sent once,
# as `shared_<column>`, its array NULL: the driver encodes two arrays a job instead of
# twelve (docs/performance.md#client). `keyless_params` builds the parameters.
_SHARED: dict[str, tuple[str, str, Any]] = {
    # column -> (its array, its shared value, the NewJob field)
    "type": ("types", "shared_type", "type"),
    "max_attempts": ("max_attempts", "shared_max_attempts", "max_attempts"),
    "queue": ("queues", "shared_queue", "queue"),
    "priority": ("priorities", "shared_priority", "priority"),
    "timeout": ("timeouts", "shared_timeout", "timeout"),
    "concurrency_key": ("concurrency_keys", "shared_concurrency_key", "concurrency_key"),
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


JOB_SUBMIT_MANY_KEYLESS = pg.insert(jobs).from_select(
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
        _shared("concurrency_key"),
        _shared("traceparent"),
        _due_at(_shared("not_before"), _shared("delay")),
    ),
)


# Concurrent single submits without a key, sent by one API process as one statement
# (docs/api.md#submit-groups): JOB_SUBMIT_MANY_KEYLESS, returning each job, since each request
# answers with its own. With a JOB_NOTIFY, sent once for the group (delivered at commit).
JOB_SUBMIT_GROUP = JOB_SUBMIT_MANY_KEYLESS.returning(*JOB_COLUMNS)
_grouped = JOB_SUBMIT_GROUP.cte("grouped")
JOB_SUBMIT_GROUP_NOTIFY = sa.select(
    _grouped,
    sa.select(sa.func.pg_notify(sa.literal_column(f"'{NOTIFY_CHANNEL}'"), sa.literal_column("''")))
    .scalar_subquery()
    .label("notified"),
)


def many_params(rows: Sequence[NewJob], payloads: Sequence[str]) -> dict[str, list[Any]]:
    """JOB_SUBMIT_MANY's parameters: one array per column, the payloads as JSON text."""
    return {
        "ids": [new.id for new in rows],
        "types": [new.type for new in rows],
        "payloads": list(payloads),
        "max_attempts": [new.max_attempts for new in rows],
        "keys": [new.idempotency_key for new in rows],
        "queues": [new.queue for new in rows],
        "priorities": [new.priority for new in rows],
        "timeouts": [new.timeout for new in rows],
        "concurrency_keys": [new.concurrency_key for new in rows],
        "traceparents": [new.traceparent for new in rows],
        "not_befores": [new.run_at for new in rows],
        "delays": [new.delay for new in rows],
    }


_FIELD_INDEX = {field: NewJob._fields.index(field) for field in NewJob._fields}


def keyless_params(rows: Sequence[NewJob], payloads: Sequence[str]) -> dict[str, Any]:
    """JOB_SUBMIT_MANY_KEYLESS's parameters for `rows` (none with an idempotency key)."""
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
