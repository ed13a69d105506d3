"""The rules a job must meet to be submitted: one create item (`new_job`), a batch of them
(`new_items`), the idempotency and concurrency keys, and what PostgreSQL jsonb can store.

Everything here is pure: no I/O. The API applies these rules to requests, and
`jobcore.enqueue` to jobs enqueued on a caller's own connection, so both refuse the same
input with the same message: `InvalidRequest` (`jobcore.errors`, a ValueError). The limits
of the scheduling and routing fields are jobcore's (the table's CHECKs use the same); the
patterns are also what the OpenAPI document shows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from uuid import UUID

from jobcore.durations import format_duration, parse_duration
from jobcore.errors import InvalidRequest as InvalidRequest  # raised here: re-exported
from jobcore.errors import Snooze
from jobcore.ids import new_id, new_ids
from jobcore.periodic import KEY_PREFIX as RESERVED_KEY_PREFIX
from jobcore.rows import NewJob
from jobcore.schema import MAX_KEY_LENGTH as MAX_CONCURRENCY_KEY_LENGTH
from jobcore.schema import MAX_PRIORITY, MAX_TIMEOUT, MIN_PRIORITY, MIN_TIMEOUT, QUEUE_PATTERN

MAX_DEPTH = 100
MAX_KEY_LENGTH = 255
KEY_PATTERN = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
# A concurrency key holds no control character (U+0000-U+001F, U+007F-U+009F), nor U+2028 or
# U+2029 (the line and paragraph separators), which glibc's iswcntrl counts too: under some
# database locale the table's CHECK ([[:cntrl:]]) may, and a key it refuses must be a 400.
CONCURRENCY_KEY_PATTERN = r"^[^\u0000-\u001f\u007f-\u009f\u2028\u2029]*$"
_CONTROL = re.compile(r"[\u0000-\u001f\u007f-\u009f\u2028\u2029]")
SCHEDULING_FIELDS = ("queue", "priority", "run_at", "delay", "timeout", "concurrency_key")
CREATE_FIELDS = ("type", "payload", "max_attempts", *SCHEDULING_FIELDS)
BATCH_ITEM_FIELDS = (*CREATE_FIELDS, "idempotency_key")
MIN_ATTEMPTS, MAX_ATTEMPTS = 1, 100
# MAX_ATTEMPTS's default (the settings' and transactional enqueue's).
DEFAULT_MAX_ATTEMPTS = 5
MIN_DELAY, MAX_DELAY = 0.0, Snooze.MAX_DELAY
_NO_OPTIONS: Mapping[str, Mapping[str, Any]] = {}

QUEUE = re.compile(QUEUE_PATTERN)
# A Go duration (`1m30s`, `500ms`) or decimal seconds as text. ASCII digits only: Python's
# \d (and float()) would take other scripts' digits too.
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
DURATION_PATTERN = f"^(?:{_NUMBER}(?:ns|us|µs|ms|s|m|h))+$|^{_NUMBER}$"
DURATION = re.compile(DURATION_PATTERN)
# RFC 3339's date-time (`T` and `Z` may be lower case). The offset is optional here only to
# tell a client that forgot it so; the document's pattern requires it.
_DATE_TIME = r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
_OFFSET = r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
TIMESTAMP_PATTERN = f"^{_DATE_TIME}{_OFFSET}$"
_TIMESTAMP = re.compile(f"{_DATE_TIME}{_OFFSET}?")
# Any time before now is due now, so a time too early for Python's datetime (year 1 with a
# positive offset) is stored exactly as this one would be.
_LONG_AGO = datetime(1970, 1, 1, tzinfo=UTC)
# The last microsecond of datetime's range is what asyncpg sends as 'infinity': a job that
# would never be due, and whose run_at would come back without a time zone.
_LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


def check_storable(value: Any) -> None:
    """Reject what PostgreSQL jsonb cannot store: U+0000 and lone surrogates in any
    string (keys too), and nesting deeper than MAX_DEPTH (iterative: no recursion limit).
    Tuples count as arrays and keys that are not strings are let be (as `json.dumps` writes
    them), for values that Python code hands over rather than parsed JSON."""
    # Each entry: a value, where it sits (None for the top, else (parent's, key, is_index);
    # rendered as `$.a[0]` only for an error message), its depth.
    stack: list[tuple[Any, Any, int]] = [(value, None, 1)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, dict):
            if depth > MAX_DEPTH:
                raise InvalidRequest(
                    f"JSON is nested deeper than {MAX_DEPTH} levels (at {_path(where)})"
                )
            for key, child in item.items():
                if isinstance(key, str) and not _storable(key):
                    check_string(key, f"a key in {_path(where)}")
                stack.append((child, (where, key, False), depth + 1))
        elif isinstance(item, list | tuple):
            if depth > MAX_DEPTH:
                raise InvalidRequest(
                    f"JSON is nested deeper than {MAX_DEPTH} levels (at {_path(where)})"
                )
            stack.extend((child, (where, i, True), depth + 1) for i, child in enumerate(item))
        elif isinstance(item, str) and not _storable(item):
            check_string(item, _path(where))


def _storable(text: str) -> bool:
    """The common case, quickly: no U+0000, and ASCII (so no lone surrogate)."""
    return text.isascii() and "\x00" not in text


def _path(where: Any) -> str:
    parts: list[str] = []
    while where is not None:
        where, key, index = where
        parts.append(f"[{key}]" if index else f".{key}")
    return "$" + "".join(reversed(parts))


def check_string(text: str, where: str) -> None:
    if "\x00" in text:
        raise InvalidRequest(f"strings must not contain \\u0000 (found at {shown(where)})")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(
            f"string at {shown(where)} holds an unpaired surrogate escape"
        ) from None


def shown(path: str) -> str:
    return path if len(path) <= 80 else path[:77] + "..."


def _names(fields: Iterable[str]) -> str:
    return ", ".join(repr(shown(f)) for f in sorted(fields))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def new_job(
    item: Any,
    *,
    known_types: Iterable[str],
    default_max_attempts: int,
    idempotency_key: str | None = None,
    allowed: Iterable[str] = CREATE_FIELDS,
    job_id: UUID | None = None,
    options: Mapping[str, Mapping[str, Any]] = _NO_OPTIONS,
) -> NewJob:
    """Validate one create request (already parsed JSON) into a `NewJob` with `job_id`, or a
    fresh id. `options` holds, per type, the defaults of its handler (create fields) for the
    fields the request omits: a field given wins, then the handler's option, then the global
    default. The result is the request after defaults, which is also what a replay of its
    idempotency key is compared with."""
    if type(item) is not dict and not isinstance(item, Mapping):
        raise InvalidRequest("request body must be a JSON object")
    unknown = item.keys() - _as_set(allowed)
    if unknown:
        raise InvalidRequest(f"unknown field(s): {_names(unknown)}; allowed: {', '.join(allowed)}")
    if "type" not in item:
        raise InvalidRequest("field 'type' is required")
    job_type = item["type"]
    if not isinstance(job_type, str):
        raise InvalidRequest("field 'type' must be a string")
    known = known_types if isinstance(known_types, frozenset) else frozenset(known_types)
    if job_type not in known:
        raise InvalidRequest(unknown_type(job_type, known))
    defaults = options.get(job_type) if options else None
    if defaults:
        item = {**defaults, **item}
    max_attempts = item.get("max_attempts", default_max_attempts)
    if not _is_int(max_attempts) or not MIN_ATTEMPTS <= max_attempts <= MAX_ATTEMPTS:
        raise InvalidRequest(
            f"field 'max_attempts' must be an integer from {MIN_ATTEMPTS} to {MAX_ATTEMPTS}"
        )
    return NewJob(
        id=new_id() if job_id is None else job_id,
        type=job_type,
        payload=item.get("payload", {}),
        max_attempts=max_attempts,
        idempotency_key=idempotency_key,
        **scheduling(item),
    )


def unknown_type(job_type: str, known: Iterable[str]) -> str:
    """The message for a type nobody declared, saying how to declare it."""
    listed = ", ".join(sorted(known))
    return (
        f"unknown job type {shown(job_type)!r}: no handler in this process, no worker of this "
        "database has recorded it, and JOB_TYPES does not name it. Declare it by running a "
        "worker that registers a handler for it (@handler in a JOB_HANDLERS module), or by "
        f"naming it in the API's JOB_TYPES; known: {listed}"
    )


_SETS: dict[Iterable[str], frozenset[str]] = {}


def _as_set(fields: Iterable[str]) -> frozenset[str]:
    found = _SETS.get(fields) if isinstance(fields, tuple) else None
    if found is None:
        found = frozenset(fields)
        if isinstance(fields, tuple):
            _SETS[fields] = found
    return found


def scheduling(item: Mapping[str, Any]) -> dict[str, Any]:
    """The `NewJob` arguments for the scheduling and routing fields present in `item`."""
    found: dict[str, Any] = {}
    if "queue" in item:
        found["queue"] = _queue(item["queue"])
    if "priority" in item:
        found["priority"] = _priority(item["priority"])
    if "run_at" in item and "delay" in item:
        raise InvalidRequest("give either field 'run_at' or field 'delay', not both")
    if "run_at" in item:
        found["run_at"] = _timestamp(item["run_at"])
    if "delay" in item:
        found["delay"] = _duration(item["delay"], "delay", MIN_DELAY, MAX_DELAY)
    if "timeout" in item:
        found["timeout"] = _duration(item["timeout"], "timeout", MIN_TIMEOUT, MAX_TIMEOUT)
    if "concurrency_key" in item:
        found["concurrency_key"] = _concurrency_key(item["concurrency_key"])
    return found


def _queue(value: Any) -> str:
    if not isinstance(value, str) or QUEUE.fullmatch(value) is None:
        raise InvalidRequest(
            "field 'queue' must be 1 to 63 characters of a-z, 0-9, '_', '.' and '-', "
            f"starting with a letter or digit ({QUEUE_PATTERN})"
        )
    return value


def _priority(value: Any) -> int:
    if not _is_int(value) or not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidRequest(
            f"field 'priority' must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}"
        )
    return int(value)


def _concurrency_key(value: Any) -> str:
    """1 to MAX_CONCURRENCY_KEY_LENGTH characters (code points, as PostgreSQL's char_length
    counts them) without a control character; any other text is a key (unlike an
    idempotency key, it never travels in a header)."""
    if not isinstance(value, str):
        raise InvalidRequest("field 'concurrency_key' must be a string")
    if not 1 <= len(value) <= MAX_CONCURRENCY_KEY_LENGTH:
        raise InvalidRequest(
            f"field 'concurrency_key' must be 1 to {MAX_CONCURRENCY_KEY_LENGTH} characters, "
            f"got {len(value)}"
        )
    found = _CONTROL.search(value)
    if found is not None:
        raise InvalidRequest(
            "field 'concurrency_key' must not contain control characters (found "
            f"U+{ord(found.group()):04X} at index {found.start()})"
        )
    check_string(value, "field 'concurrency_key'")  # a lone surrogate, from Python code
    return value


def _duration(value: Any, name: str, low: float, high: float) -> float:
    seconds = None
    text = isinstance(value, str) and DURATION.fullmatch(value) is not None
    if text or (isinstance(value, int | float) and not isinstance(value, bool)):
        try:
            seconds = parse_duration(value)
        except (ValueError, OverflowError):  # OverflowError: an integer beyond float range
            seconds = None
    if seconds is None or not low <= seconds <= high:
        days = f" ({high / 86400:g} days)" if high > 86400 else ""
        raise InvalidRequest(
            f"field {name!r} must be a duration from {format_duration(low)} to "
            f"{format_duration(high)}{days}: a number of seconds, or a string such as 90s, "
            "1m30s or 1.5h"
        )
    return seconds


def _timestamp(value: Any) -> datetime:
    """An RFC 3339 time with an offset, in UTC (microseconds; further digits dropped)."""
    match = _TIMESTAMP.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise InvalidRequest(
            "field 'run_at' must be an RFC 3339 timestamp with an offset, such as "
            "2026-12-01T09:30:00Z or 2026-12-01T10:30:00+01:00"
        )
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    if zulu is None and sign is None:
        raise InvalidRequest(
            "field 'run_at' has no offset: add Z (UTC) or one such as +01:00, "
            "e.g. 2026-12-01T09:30:00Z"
        )
    # A leap second (:60) is the next minute's first, as PostgreSQL reads it.
    leap = second == "60"
    try:
        offset = timedelta(hours=int(off_h or 0), minutes=int(off_m or 0))
        if int(off_h or 0) > 23 or int(off_m or 0) > 59:
            raise ValueError("offset out of range")
        local = datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            59 if leap else int(second),
            int((fraction or "")[:6].ljust(6, "0")),
            tzinfo=timezone(-offset if sign == "-" else offset),
        )
    except ValueError:
        raise InvalidRequest(f"field 'run_at' is not a valid time: {shown(value)!r}") from None
    try:
        due: datetime | None = local.astimezone(UTC) + timedelta(seconds=1 if leap else 0)
    except OverflowError:
        if local.year < 5000:
            return _LONG_AGO
        due = None
    if due is None or due > _LATEST:
        raise InvalidRequest("field 'run_at' must be at most 9999-12-31T23:59:59Z")
    return due


def check_key(key: Any, name: str) -> str:
    """An idempotency key (header or field) of 1–255 printable ASCII characters, not in
    the periodic schedules' namespace (`periodic:`).

    No leading or trailing space: HTTP strips them from header values, so such a
    key could not be sent back unchanged.
    """
    if not isinstance(key, str):
        raise InvalidRequest(f"{name} must be a string")
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise InvalidRequest(f"{name} must be 1 to {MAX_KEY_LENGTH} characters, got {len(key)}")
    if not KEY_PATTERN.fullmatch(key):
        raise InvalidRequest(
            f"{name} must contain only printable ASCII characters, without leading or "
            "trailing spaces"
        )
    if key.startswith(RESERVED_KEY_PREFIX):
        # A client could otherwise take a schedule's tick ahead of it: skip it (another
        # request under its key) or postpone it (the same request with a delay).
        raise InvalidRequest(
            f"{name} must not start with {RESERVED_KEY_PREFIX!r}: those keys are reserved "
            "for the ticks of periodic schedules"
        )
    return key


def new_items(
    items: Iterable[Any],
    *,
    known_types: Iterable[str],
    default_max_attempts: int,
    prepare: Callable[[Any], Any] | None = None,
    options: Mapping[str, Mapping[str, Any]] = _NO_OPTIONS,
) -> list[NewJob]:
    """Validate create items, each with an optional `idempotency_key`: every item or none.

    When any item is invalid, the message names every invalid item by its index.
    `prepare` turns an item into parsed JSON first (raising InvalidRequest if it cannot).
    """
    types = frozenset(known_types)
    given_items = items if isinstance(items, list | tuple) else list(items)
    ids = new_ids(len(given_items))
    valid: list[NewJob] = []
    problems: list[str] = []
    for index, given in enumerate(given_items):
        try:
            item = given if prepare is None else prepare(given)
            key = None
            if isinstance(item, Mapping) and "idempotency_key" in item:
                key = check_key(item["idempotency_key"], "field 'idempotency_key'")
            valid.append(
                new_job(
                    item,
                    known_types=types,
                    default_max_attempts=default_max_attempts,
                    idempotency_key=key,
                    allowed=BATCH_ITEM_FIELDS,
                    job_id=ids[index],
                    options=options,
                )
            )
        except InvalidRequest as exc:
            problems.append(f"[{index}] {exc}")
    if problems:
        listed = "; ".join(problems[:20]) + ("; ..." if len(problems) > 20 else "")
        raise InvalidRequest(f"{len(problems)} invalid item(s), nothing was written: {listed}")
    return valid
