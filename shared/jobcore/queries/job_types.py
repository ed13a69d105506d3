"""The statements over `job_types`, what the workers serve: each worker process records its
types (with their handler options and its periodic schedules) at start and every
`jobqueue_worker.served.INTERVAL`; the API and transactional enqueue read them to accept
types they have no handler for, with those options as defaults."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from jobcore.queries.common import ONE_SECOND
from jobcore.rows import JobTypeRecord
from jobcore.schema import job_types

_t = job_types.c

_given = (
    sa.func.unnest(
        sa.bindparam("types", type_=pg.ARRAY(sa.Text)),
        sa.bindparam("options", type_=pg.ARRAY(sa.Text)),
        sa.bindparam("schedules", type_=pg.ARRAY(sa.Text)),
    )
    .table_valued(
        sa.column("type", sa.Text), sa.column("options", sa.Text), sa.column("schedules", sa.Text)
    )
    .render_derived(name="g")
)
_insert = pg.insert(job_types).from_select(
    ["type", "options", "schedules", "recorded_by", "recorded_at"],
    sa.select(
        _given.c.type,
        sa.cast(_given.c.options, pg.JSONB),
        sa.cast(_given.c.schedules, pg.JSONB),
        sa.bindparam("recorded_by", type_=sa.Text),
        sa.func.now(),
    )
    # Rows locked in one order by every worker: two recording at once cannot deadlock.
    .order_by(_given.c.type),
)
# One worker process's types, recorded (or refreshed) in one statement. The last process to
# record a type holds its row: during a deploy that changes a type's options, the row
# follows whichever process refreshed last until the old processes are gone.
JOB_TYPE_RECORD = _insert.on_conflict_do_update(
    index_elements=[_t.type],
    set_={
        "options": _insert.excluded.options,
        "schedules": _insert.excluded.schedules,
        "recorded_by": _insert.excluded.recorded_by,
        "recorded_at": _insert.excluded.recorded_at,
    },
)

_COLUMNS = (_t.type, _t.options, _t.schedules, _t.recorded_by, _t.recorded_at)
# A record counts while some worker refreshed it within `max_age` seconds.
_fresh = _t.recorded_at > sa.func.now() - sa.bindparam("max_age", type_=sa.Float) * ONE_SECOND

# Every type recorded within max_age, by type.
JOB_TYPE_LIST = sa.select(*_COLUMNS).where(_fresh).order_by(_t.type)

# The given types, of those recorded within max_age.
JOB_TYPE_FIND = (
    sa.select(*_COLUMNS)
    .where(_t.type == sa.any_(sa.bindparam("types", type_=pg.ARRAY(sa.Text))), _fresh)
    .order_by(_t.type)
)


def record_params(records: Sequence[tuple[str, str, str]], recorded_by: str) -> dict[str, Any]:
    """JOB_TYPE_RECORD's parameters: (type, options as JSON text, schedules as JSON text)."""
    ordered = sorted(records)
    return {
        "types": [r[0] for r in ordered],
        "options": [r[1] for r in ordered],
        "schedules": [r[2] for r in ordered],
        "recorded_by": recorded_by,
    }


def record_from_row(row: Any) -> JobTypeRecord:
    """A record from its row, by name. A bare asyncpg connection (transactional enqueue on
    the caller's) returns jsonb as text: decoded here."""
    return JobTypeRecord(
        type=row["type"],
        options=dict(_json(row["options"]) or {}),
        schedules=list(_json(row["schedules"]) or []),
        recorded_by=row["recorded_by"],
        recorded_at=row["recorded_at"],
    )


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value
