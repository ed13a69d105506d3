"""Paused queues: pausing and resuming a queue, and reading which queues are paused.

The state is a row per paused queue in `queue_pauses` (docs/worker.md#pausing-a-queue).
Pausing and resuming announce the queue on `PAUSE_CHANNEL`; each worker process re-reads
the paused queues when it hears it (and every `PAUSE_POLL` seconds, for a notification it
missed) and claims nothing from those. Submissions and periodic jobs are not affected: a
paused queue fills up, and drains once resumed. Any queue name that a job may carry can be
paused, also one no job has used yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.ext.asyncio import AsyncConnection

from jobcore.errors import InvalidRequest, SchemaNotAtHead
from jobcore.schema import QUEUE_PATTERN, queue_pauses
from jobcore.search import QueueDepth, queue_depths
from jobcore.validation import QUEUE

p = queue_pauses.c

# The revision that adds `queue_pauses`. The services also run on 0008 and 0009 (while
# `jobqueue migrate` defers 0009, docs/upgrading.md): there nothing is paused, and a pause
# is refused until the schema is migrated.
PAUSES_REVISION = "0010"
_UNDEFINED_TABLE = "42P01"


def _missing_table(exc: sa_exc.DBAPIError) -> bool:
    return getattr(exc.orig, "sqlstate", None) == _UNDEFINED_TABLE


# Workers LISTEN on this channel: the name of a queue just paused or resumed.
PAUSE_CHANNEL = "jobqueue_pauses"
# How often a worker process re-reads the paused queues without being told.
PAUSE_POLL = 1.0


def _announced(column: sa.ColumnElement[str]) -> sa.ColumnElement[str]:
    return sa.func.pg_notify(sa.literal_column(f"'{PAUSE_CHANNEL}'"), column).label("announced")


_insert = pg.insert(queue_pauses).values(queue=sa.bindparam("queue", type_=sa.Text))
# An upsert that changes nothing, so that a pause of a paused queue returns its row too (and
# announces it again: a worker that missed the first announcement hears this one). The
# first pause's time stands.
QUEUE_PAUSE = _insert.on_conflict_do_update(
    index_elements=[p.queue], set_={"queue": _insert.excluded.queue}
).returning(p.queue, p.paused_at, _announced(p.queue))

# No row: the queue was not paused (nothing to announce).
QUEUE_RESUME = (
    sa.delete(queue_pauses)
    .where(p.queue == sa.bindparam("queue", type_=sa.Text))
    .returning(p.queue, _announced(p.queue))
)

QUEUE_LIST_PAUSED = sa.select(p.queue, p.paused_at).order_by(p.queue)
QUEUE_GET_PAUSED = sa.select(
    sa.exists().where(p.queue == sa.bindparam("queue", type_=sa.Text)).label("paused")
)

# By their SQL name, for `jobcore.queries.named()`.
NAMED = {
    "queue_pause": QUEUE_PAUSE,
    "queue_resume": QUEUE_RESUME,
    "queue_list_paused": QUEUE_LIST_PAUSED,
    "queue_get_paused": QUEUE_GET_PAUSED,
}


@dataclass(frozen=True)
class Paused:
    """A paused queue, and since when (the first pause since it was last resumed)."""

    queue: str
    paused_at: datetime


def check_queue(queue: str) -> str:
    """`queue` if it is a name a job's queue may have, else InvalidRequest."""
    if not isinstance(queue, str) or QUEUE.fullmatch(queue) is None:
        raise InvalidRequest(
            f"queue name {str(queue)[:100]!r} must be 1 to 63 characters of a-z, 0-9, '_', "
            f"'.' and '-', starting with a letter or digit ({QUEUE_PATTERN})"
        )
    return queue


async def pause(conn: AsyncConnection, queue: str) -> Paused:
    """Pause `queue` (idempotent): workers stop claiming from it within a second. Raises
    InvalidRequest for a name no queue can have."""
    checked = check_queue(queue)
    try:
        row = (await conn.execute(QUEUE_PAUSE, {"queue": checked})).mappings().one()
    except sa_exc.DBAPIError as exc:
        if not _missing_table(exc):
            raise
        raise SchemaNotAtHead(None, PAUSES_REVISION) from exc
    return Paused(row["queue"], row["paused_at"])


async def resume(conn: AsyncConnection, queue: str) -> bool:
    """Resume `queue` (idempotent); True if it was paused. Raises InvalidRequest for a name no
    queue can have."""
    checked = check_queue(queue)
    try:
        rows = (await conn.execute(QUEUE_RESUME, {"queue": checked})).all()
    except sa_exc.DBAPIError as exc:
        if not _missing_table(exc):
            raise
        return False  # nothing can be paused before 0010
    return bool(rows)


async def paused_queues(conn: AsyncConnection) -> list[Paused]:
    """Every paused queue, by name (none on a schema before 0010)."""
    try:
        rows = (await conn.execute(QUEUE_LIST_PAUSED)).mappings().all()
    except sa_exc.DBAPIError as exc:
        if not _missing_table(exc):
            raise
        return []
    return [Paused(row["queue"], row["paused_at"]) for row in rows]


async def is_paused(conn: AsyncConnection, queue: str) -> bool:
    """Whether `queue` is paused (False for a name no queue can have)."""
    if not isinstance(queue, str) or QUEUE.fullmatch(queue) is None:
        return False
    try:
        return bool((await conn.execute(QUEUE_GET_PAUSED, {"queue": queue})).scalar())
    except sa_exc.DBAPIError as exc:
        if not _missing_table(exc):
            raise
        return False


async def queues_with_pauses(conn: AsyncConnection) -> list[tuple[QueueDepth, bool]]:
    """Every queue that holds jobs or is paused, by name, with its depths (all zero for a
    paused queue without jobs) and whether it is paused (`GET /queues`, the dashboard)."""
    depths = {depth.queue: depth for depth in await queue_depths(conn)}
    paused = {row.queue for row in await paused_queues(conn)}
    for queue in paused - depths.keys():
        depths[queue] = QueueDepth(queue, 0, 0, 0, 0, 0.0)
    return [(depths[queue], queue in paused) for queue in sorted(depths)]
