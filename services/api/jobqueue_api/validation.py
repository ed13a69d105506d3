"""Turning request bytes, headers and query parameters into a `NewJob`, a wait or a list
query, or into one clear 400 message.

Everything here is pure: no I/O, no framework. The rules a job item must meet are
`jobcore.validation`'s (transactional enqueue applies the same); this module adds what
only HTTP has: the body's bytes, the batch envelope, the `Idempotency-Key` header and
the query parameters. The patterns here are also what the OpenAPI document shows.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from jobcore.durations import format_duration, parse_duration
from jobcore.rows import NewJob
from jobcore.schema import QUEUE_PATTERN
from jobcore.search import DEFAULT_LIMIT, MAX_LIMIT, Filters
from jobcore.states import Status
from jobcore.validation import (
    BATCH_ITEM_FIELDS,
    CONCURRENCY_KEY_PATTERN,
    CREATE_FIELDS,
    DURATION,
    DURATION_PATTERN,
    KEY_PATTERN,
    MAX_ATTEMPTS,
    MAX_DELAY,
    MAX_DEPTH,
    MAX_KEY_LENGTH,
    MIN_ATTEMPTS,
    MIN_DELAY,
    QUEUE,
    SCHEDULING_FIELDS,
    TIMESTAMP_PATTERN,
    InvalidRequest,
    check_key,
    check_storable,
    check_string,
    new_items,
    new_job,
    scheduling,
    shown,
)
from jobqueue_api import jsonio

__all__ = [
    "BATCH_ITEM_FIELDS",
    "CONCURRENCY_KEY_PATTERN",
    "CREATE_FIELDS",
    "CURSOR_PATTERN",
    "DURATION_PATTERN",
    "KEY_PATTERN",
    "LIST_PARAMETERS",
    "MAX_ATTEMPTS",
    "MAX_BATCH",
    "MAX_DELAY",
    "MAX_DEPTH",
    "MAX_KEY_LENGTH",
    "MAX_WAIT",
    "MIN_ATTEMPTS",
    "MIN_DELAY",
    "SCHEDULING_FIELDS",
    "TIMESTAMP_PATTERN",
    "InvalidRequest",
    "ListQuery",
    "check_key",
    "check_storable",
    "decode_cursor",
    "encode_cursor",
    "idempotency_key",
    "list_query",
    "new_job",
    "new_many",
    "parse_json",
    "query",
    "scheduling",
    "wait",
]

MAX_BATCH = 1000


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidRequest(f"number {text} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise InvalidRequest(f"{name} is not valid JSON")


def parse_json(body: bytes) -> Any:
    """The JSON document in `body` (UTF-8), checked to be storable as jsonb.

    Read with orjson (`jsonio.parse`) whenever that gives the very value `json` gives;
    any other document, and any document found wanting, goes through `parse_json_stdlib`,
    so that every value and every error message is the standard library's."""
    value = jsonio.parse(body)
    if value is jsonio.FALLBACK:
        return parse_json_stdlib(body)
    try:
        check_storable(value)
    except InvalidRequest:
        return parse_json_stdlib(body)
    return value


def parse_json_stdlib(body: bytes) -> Any:
    """`parse_json` with the standard library alone: the reference for its values and errors."""
    if not body.strip():
        raise InvalidRequest("request body is empty; expected a JSON object")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest("request body is not valid UTF-8") from None
    try:
        value = json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)
    except InvalidRequest:
        raise
    except RecursionError:
        raise InvalidRequest(f"JSON is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, and integers too long to convert
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    check_storable(value)
    return value


def new_many(
    body: Any,
    *,
    known_types: Iterable[str],
    default_max_attempts: int,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[NewJob]:
    """Validate a bulk create request `{"jobs": [...]}`: every item or none.

    Each item is a create request plus an optional `idempotency_key`. When any
    item is invalid, the message names every invalid item by its index.
    """
    if not isinstance(body, Mapping) or set(body) != {"jobs"}:
        raise InvalidRequest('request body must be a JSON object {"jobs": [...]}')
    items = body["jobs"]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
        raise InvalidRequest(f"field 'jobs' must be an array of 1 to {MAX_BATCH} job requests")
    return new_items(
        items,
        known_types=known_types,
        default_max_attempts=default_max_attempts,
        options=options or {},
    )


def idempotency_key(values: list[str]) -> str | None:
    """The `Idempotency-Key` header's value, or None if absent."""
    if not values:
        return None
    if len(values) > 1:
        raise InvalidRequest("Idempotency-Key must be sent at most once")
    return check_key(values[0], "Idempotency-Key")


# --- query parameters ------------------------------------------------------------

MAX_WAIT = 60.0
LIST_PARAMETERS = ("status", "type", "queue", "limit", "cursor")
_LIMIT = re.compile(r"[0-9]{1,6}")
# base64url without padding of the 16 bytes of a job id.
CURSOR_PATTERN = "^[A-Za-z0-9_-]{21}[AQgw]$"
_CURSOR = re.compile(CURSOR_PATTERN)


@dataclass(frozen=True)
class ListQuery:
    filters: Filters
    limit: int
    before: UUID | None


def query(pairs: Iterable[tuple[str, str]], allowed: Iterable[str]) -> dict[str, str]:
    """The query parameters as a dict: each known, and given at most once."""
    found: dict[str, str] = {}
    known = tuple(allowed)
    for name, value in pairs:
        if name not in known:
            hint = f"; allowed: {', '.join(known)}" if known else "; this endpoint takes none"
            raise InvalidRequest(f"unknown query parameter {shown(name)!r}{hint}")
        if name in found:
            raise InvalidRequest(f"query parameter {name!r} is given more than once")
        found[name] = value
    return found


def wait(value: str) -> float:
    """The `wait` parameter: seconds, more than 0 and at most MAX_WAIT."""
    seconds = None
    if DURATION.fullmatch(value) is not None:
        with contextlib.suppress(ValueError, OverflowError):
            seconds = parse_duration(value)
    if seconds is None or not 0 < seconds <= MAX_WAIT:
        raise InvalidRequest(
            f"query parameter 'wait' must be a duration above 0 and at most "
            f"{format_duration(MAX_WAIT)}: seconds (30, 2.5) or a Go duration such as 500ms "
            "or 1m"
        )
    return seconds


def list_query(params: Mapping[str, str]) -> ListQuery:
    """`GET /jobs`'s parameters (from `query(..., LIST_PARAMETERS)`)."""
    statuses = None
    if "status" in params:
        statuses = frozenset(_status(name) for name in params["status"].split(","))
    job_type = params.get("type")
    if job_type is not None:
        if not job_type:
            raise InvalidRequest("query parameter 'type' must not be empty")
        check_string(job_type, "query parameter 'type'")
    queue = params.get("queue")
    if queue is not None and QUEUE.fullmatch(queue) is None:
        raise InvalidRequest(f"query parameter 'queue' must match {QUEUE_PATTERN}")
    limit = DEFAULT_LIMIT
    if "limit" in params:
        text = params["limit"]
        limit = int(text) if _LIMIT.fullmatch(text) else 0
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidRequest(
                f"query parameter 'limit' must be an integer from 1 to {MAX_LIMIT}"
            )
    before = decode_cursor(params["cursor"]) if "cursor" in params else None
    return ListQuery(Filters(statuses, job_type, queue), limit, before)


def _status(name: str) -> Status:
    try:
        return Status(name)
    except ValueError:
        raise InvalidRequest(
            f"unknown status {shown(name)!r} in query parameter 'status'; "
            f"one of: {', '.join(sorted(s.value for s in Status))}"
        ) from None


def encode_cursor(job_id: UUID) -> str:
    """The opaque `next_cursor`: where the next page starts (below this id)."""
    return base64.urlsafe_b64encode(job_id.bytes).rstrip(b"=").decode("ascii")


def decode_cursor(text: str) -> UUID:
    if _CURSOR.fullmatch(text) is None:
        raise InvalidRequest(
            "query parameter 'cursor' is not a cursor this API returned (next_cursor)"
        )
    return UUID(bytes=base64.urlsafe_b64decode(text + "=="))
