"""The schedules page's rows: the periodic schedules the workers recorded in `job_types`
(each with its type's record), their next tick, and the job their latest tick created, found
by its idempotency key (`periodic:<name>:<tick>`, `jobcore.periodic`) in one read of
`jobs_idempotency_key_idx`."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncConnection

from jobcore import search
from jobcore.catalog import recorded_options
from jobcore.periodic import KEY_PREFIX, last_tick, next_tick, tick_text
from jobcore.rows import JobTypeRecord

log = logging.getLogger("jobqueue.api")

# The ticks looked up per schedule, newest first: the latest tick's job may not be created
# yet (a worker creates it a moment after the tick).
TICKS_LOOKED_UP = 2
DEFAULT_QUEUE = "default"
_SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class LastJob:
    id: UUID
    status: str
    created_at: datetime


@dataclass(frozen=True)
class Shown:
    name: str
    cron: str
    type: str
    queue: str
    next_tick: datetime | None  # None: the recorded cron is not one this release reads
    recorded_by: str
    recorded_at: datetime
    last_job: LastJob | None


async def listed(
    conn: AsyncConnection, records: Iterable[JobTypeRecord], now: datetime
) -> list[Shown]:
    """Every schedule recorded, by name (a name recorded under two types, by processes of two
    releases, shows twice)."""
    found: list[tuple[Shown, list[str]]] = []
    for record in records:
        options = recorded_options(record)
        for entry in record.schedules:
            found.append(_one(record, options, entry, now))
    keys = [key for _, ticks in found for key in ticks]
    jobs: dict[str, LastJob] = {}
    if keys:
        for row in await conn.execute(search.JOB_FIND_BY_KEYS, {"keys": keys}):
            jobs[row.idempotency_key] = LastJob(row.id, row.status, row.created_at)
    shown = []
    for schedule, ticks in found:
        latest = next((jobs[k] for k in ticks if k in jobs), None)
        shown.append(replace(schedule, last_job=latest))
    return sorted(shown, key=lambda s: (s.name, s.type))


def _one(
    record: JobTypeRecord, options: dict[str, Any], entry: Any, now: datetime
) -> tuple[Shown, list[str]]:
    entry = entry if isinstance(entry, dict) else {}
    name = str(entry.get("name", "?"))
    cron = str(entry.get("cron", "?"))
    queue = entry.get("queue") or options.get("queue") or DEFAULT_QUEUE
    ticks: list[str] = []
    following = None
    try:
        following = next_tick(cron, now)
        tick = last_tick(cron, now)
        for _ in range(TICKS_LOOKED_UP):
            ticks.append(f"{KEY_PREFIX}{name}:{tick_text(tick)}")
            tick = last_tick(cron, tick.replace(microsecond=0) - _SECOND)
    except Exception as exc:  # croniter's errors: a cron a newer release wrote
        log.warning("recorded schedule not read", extra={"schedule": name, "error": str(exc)})
    shown = Shown(
        name, cron, record.type, str(queue), following, record.recorded_by, record.recorded_at, None
    )
    return shown, ticks
