"""Periodic jobs: `periodic(cron, type, ...)` declares a schedule, and its ticks in UTC.

A `JOB_HANDLERS` module declares schedules beside its handlers:

    periodic("*/5 * * * *", "report", payload={"scope": "all"}, name="report-5m")

Every worker process submits one job per tick of every schedule; the idempotency key
`periodic:<name>:<tick>` (the tick as `YYYY-MM-DDTHH:MM:SSZ`) makes the database keep
exactly one of them, so no process leads (see `jobqueue_worker.periodic`). Keys starting
with `periodic:` are therefore this module's namespace.

Cron syntax, as croniter parses it, always in UTC:
- standard 5 fields, `minute hour day-of-month month day-of-week` (names such as MON or
  JAN, ranges, lists and steps; day-of-month and day-of-week restricted together match
  either, as in cron), and the nicknames @yearly, @annually, @monthly, @weekly, @daily,
  @midnight and @hourly;
- an extension: 6 fields, the first being seconds (`*/10 * * * * *`: every 10 s), as in
  Quartz or robfig/cron. It lets a schedule tick more than once a minute (and tests run
  over several ticks in seconds).
Refused with a ValueError when declared: any other field count, values out of range, a
schedule that never fires (`0 0 31 2 *`), and croniter's hashed and random forms (`H`,
`R`), since every process must compute the same ticks.

A schedule's name is its identity across processes and deploys: by default
`<type> <cron>`; one name holds one schedule (declaring the same one again is a no-op,
a different one under the name a ValueError). Importing this module performs no I/O and
imports neither croniter nor SQLAlchemy: only modules that declare a schedule pay for them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

KEY_PREFIX = "periodic:"
# A key is at most 255 printable ASCII characters, as the API's Idempotency-Key:
# "periodic:" + name + ":" + a 20-character tick.
MAX_NAME_LENGTH = 255 - len(KEY_PREFIX) - 1 - len("2024-01-01T00:00:00Z")
_NAME = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
_NICKNAMES = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
# croniter's hashed (H) and random (R) forms; not the H or R inside THU, FRI, MAR or APR.
_HASHED = re.compile(r"(?<![a-z])[hr](?![a-z])", re.IGNORECASE)
# The table's check on max_attempts.
_MIN_ATTEMPTS, _MAX_ATTEMPTS = 1, 100


@dataclass(frozen=True)
class Schedule:
    """One periodic job. A field None takes the type's handler option (`@handler`), else the
    global default: queue `default`, priority 0, the submitting worker's MAX_ATTEMPTS, its
    JOB_TIMEOUT."""

    name: str
    cron: str
    type: str
    payload: Any
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    timeout: float | None = None

    def next_tick(self, after: datetime) -> datetime:
        return next_tick(self.cron, after)

    def last_tick(self, at: datetime) -> datetime:
        return last_tick(self.cron, at)

    def key(self, tick: datetime) -> str:
        """The idempotency key of this schedule's job for `tick`."""
        return f"{KEY_PREFIX}{self.name}:{tick_text(tick)}"


_schedules: dict[str, Schedule] = {}


def periodic(
    cron: str,
    type: str,
    payload: Any = None,
    *,
    name: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    timeout: float | str | None = None,
) -> Schedule:
    """Declare a job of `type` created at every tick of `cron` (UTC) by the workers.

    `payload` None is `{}`, as in a create request; it must be JSON. `timeout` is seconds
    or a duration (`"5m"`). `queue`, `priority`, `max_attempts` and `timeout` left out take
    the handler's options, else the global defaults. Raises ValueError when anything is
    invalid or `name` already holds a different schedule.
    """
    cron = check_cron(cron)
    if not isinstance(type, str) or not type.strip():
        raise ValueError("periodic: the job type must be a non-empty string")
    if name is None:
        name = f"{type} {cron}"
    if not isinstance(name, str) or not (len(name) <= MAX_NAME_LENGTH and _NAME.fullmatch(name)):
        raise ValueError(
            f"periodic: name {name!r} must be 1 to {MAX_NAME_LENGTH} printable ASCII "
            "characters without leading or trailing spaces (pass name=... to choose one)"
        )
    schedule = Schedule(
        name=name,
        cron=cron,
        type=type,
        payload=_json({} if payload is None else payload, name),
        queue=_queue(queue, name),
        priority=_priority(priority, name),
        max_attempts=_max_attempts(max_attempts, name),
        timeout=_timeout(timeout, name),
    )
    existing = _schedules.get(name)
    if existing is not None and existing != schedule:
        raise ValueError(f"periodic: name {name!r} already holds a different schedule")
    _schedules[name] = schedule
    return schedule


def schedules() -> list[Schedule]:
    """Every declared schedule, by name."""
    return [_schedules[name] for name in sorted(_schedules)]


def check_cron(cron: str) -> str:
    """`cron` with its whitespace normalised; ValueError if it is not accepted."""
    if not isinstance(cron, str):
        raise ValueError(f"periodic: cron must be a string, got {cron!r}")
    fields = cron.split()
    normal = " ".join(fields)
    if len(fields) == 1 and normal.lower() in _NICKNAMES:
        normal = normal.lower()
    elif len(fields) not in (5, 6):
        raise ValueError(
            f"periodic: cron {cron!r} must have 5 fields (minute hour day month weekday), "
            "6 with seconds first, or be a nickname such as @hourly"
        )
    if _HASHED.search(normal):
        raise ValueError(f"periodic: cron {cron!r}: hashed (H) and random (R) forms are refused")
    try:
        next_tick(normal, datetime.now(UTC))
    except Exception as exc:  # croniter raises ValueErrors; anything else is as unusable
        raise ValueError(f"periodic: cron {cron!r} is invalid: {exc}") from None
    return normal


def next_tick(cron: str, after: datetime) -> datetime:
    """The first tick of `cron` strictly after `after` (an aware time), in UTC."""
    from croniter import croniter

    start = _utc(after)
    tick: datetime = croniter(cron, start, second_at_beginning=_has_seconds(cron)).get_next(
        datetime
    )
    return tick.astimezone(UTC)


def last_tick(cron: str, at: datetime) -> datetime:
    """The last tick of `cron` at or before `at` (an aware time), in UTC."""
    from croniter import croniter

    at = _utc(at)
    before: datetime = croniter(cron, at, second_at_beginning=_has_seconds(cron)).get_prev(datetime)
    # croniter's previous tick is strictly before a whole second, yet at or before a time
    # with a fraction: the tick after it settles which one `at` has reached.
    after = next_tick(cron, before)
    return after if after <= at else before.astimezone(UTC)


def tick_text(tick: datetime) -> str:
    """A tick as it appears in keys and logs: `2024-01-01T10:05:00Z`."""
    return f"{tick.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def _has_seconds(cron: str) -> bool:
    return len(cron.split()) == 6


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"periodic: {moment!r} has no time zone")
    return moment.astimezone(UTC)


def _json(payload: Any, name: str) -> Any:
    # A copy of the value as stored, so later changes to the caller's object do not leak in.
    try:
        return json.loads(json.dumps(payload, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"periodic {name!r}: payload is not JSON: {exc}") from None


def _queue(queue: Any, name: str) -> str | None:
    from jobcore.schema import QUEUE_PATTERN

    if queue is None:
        return None
    if not isinstance(queue, str) or not re.fullmatch(QUEUE_PATTERN, queue):
        raise ValueError(f"periodic {name!r}: queue {queue!r} must match {QUEUE_PATTERN}")
    return queue


def _priority(priority: Any, name: str) -> int | None:
    from jobcore.schema import MAX_PRIORITY, MIN_PRIORITY

    if priority is None:
        return None
    if not _is_int(priority) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(
            f"periodic {name!r}: priority must be an integer from {MIN_PRIORITY} to "
            f"{MAX_PRIORITY}, got {priority!r}"
        )
    return int(priority)


def _max_attempts(max_attempts: Any, name: str) -> int | None:
    if max_attempts is not None and (
        not _is_int(max_attempts) or not _MIN_ATTEMPTS <= max_attempts <= _MAX_ATTEMPTS
    ):
        raise ValueError(
            f"periodic {name!r}: max_attempts must be an integer from {_MIN_ATTEMPTS} to "
            f"{_MAX_ATTEMPTS}, got {max_attempts!r}"
        )
    return None if max_attempts is None else int(max_attempts)


def _timeout(timeout: Any, name: str) -> float | None:
    if timeout is None:
        return None
    from jobcore.durations import format_duration, parse_duration
    from jobcore.schema import MAX_TIMEOUT, MIN_TIMEOUT

    try:
        seconds = parse_duration(timeout)
    except ValueError as exc:
        raise ValueError(f"periodic {name!r}: timeout: {exc}") from None
    if not MIN_TIMEOUT <= seconds <= MAX_TIMEOUT:
        raise ValueError(
            f"periodic {name!r}: timeout must be from {format_duration(MIN_TIMEOUT)} to "
            f"{format_duration(MAX_TIMEOUT)}, got {timeout!r}"
        )
    return seconds


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
