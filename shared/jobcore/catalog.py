"""Which types a submit accepts, and the defaults it applies to them: the pure part, shared by
the API (`jobqueue_api.catalog`), transactional enqueue and the workers that record them.

A submit accepts a type registered in the submitting process, named in the API's JOB_TYPES,
or recorded in `job_types` by a worker of the database within `MAX_AGE` (a worker refreshes
its record every minute at most, so a record that old belongs to workers long gone). Its
defaults are the handler's options: those of the process's own handler when it has one, else
those the worker recorded. A type named only in JOB_TYPES has none.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from jobcore.periodic import Schedule
from jobcore.registry import OPTION_FIELDS, HandlerOptions, HandlerOptionsError, known
from jobcore.rows import JobTypeRecord

log = logging.getLogger("jobqueue")

# How long a worker's record of a type counts without being refreshed.
MAX_AGE = 7 * 86400.0


class Known(NamedTuple):
    """The types a submit accepts, and per type its defaults as create fields."""

    types: frozenset[str]
    options: Mapping[str, Mapping[str, Any]]


def merged(named: Iterable[str] = (), records: Iterable[JobTypeRecord] = ()) -> Known:
    """The types of this process's registry, `named` (JOB_TYPES) and `records`, with the
    options of the registry over those recorded."""
    local_types, local_options = known()
    options: dict[str, Mapping[str, Any]] = {}
    types = set(local_types)
    types.update(named)
    for record in records:
        types.add(record.type)
        fields = recorded_options(record)
        if fields and record.type not in local_types:
            options[record.type] = fields
    options.update(local_options)
    return Known(frozenset(types), options)


def recorded_options(record: JobTypeRecord) -> dict[str, Any]:
    """A record's options as create fields, checked as `@handler` checks them: options a
    later release may add are left out, and a record whose options break today's rules
    gives no defaults (logged) rather than refusing every submit of its type."""
    given = {name: record.options[name] for name in OPTION_FIELDS if name in record.options}
    if not given:
        return {}
    try:
        return HandlerOptions.check(record.type, given).fields()
    except HandlerOptionsError as exc:
        log.warning(
            "recorded handler options ignored",
            extra={"type": record.type, "recorded_by": record.recorded_by, "error": str(exc)},
        )
        return {}


def worker_records(schedules: Iterable[Schedule]) -> list[tuple[str, str, str]]:
    """What a worker process records: each type it has a handler for, with its options and
    the process's schedules of that type, as (type, options JSON, schedules JSON)."""
    types, options = known()
    by_type: dict[str, list[dict[str, Any]]] = {t: [] for t in types}
    for schedule in schedules:
        if schedule.type in by_type:
            by_type[schedule.type].append(_schedule_json(schedule))
    return [
        (t, json.dumps(options.get(t, {}), sort_keys=True), json.dumps(by_type[t]))
        for t in sorted(types)
    ]


def _schedule_json(schedule: Schedule) -> dict[str, Any]:
    found = {"name": schedule.name, "cron": schedule.cron, "payload": schedule.payload}
    for name in OPTION_FIELDS:
        value = getattr(schedule, name)
        if value is not None:
            found[name] = value
    return found


def recorder_name() -> str:
    """Who records: `<host>:<pid>`, as an operator finds the process."""
    return f"{socket.gethostname()}:{os.getpid()}"
