"""Turning request bytes and headers into a `NewJob`, or into one clear 400 message.

Everything here is pure: no I/O, no framework. One create item is validated
on its own (`new_job`), so a bulk endpoint can apply it to each item.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from jobcore.ids import new_id
from jobcore.store import NewJob

MAX_DEPTH = 100
MAX_KEY_LENGTH = 255
KEY_PATTERN = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
CREATE_FIELDS = ("type", "payload", "max_attempts")
BATCH_ITEM_FIELDS = (*CREATE_FIELDS, "idempotency_key")
MAX_BATCH = 1000
MIN_ATTEMPTS, MAX_ATTEMPTS = 1, 100


class Invalid(ValueError):
    """The request cannot be accepted; the message is meant for the client."""


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Invalid(f"number {text} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise Invalid(f"{name} is not valid JSON")


def parse_json(body: bytes) -> Any:
    """The JSON document in `body` (UTF-8), checked to be storable as jsonb."""
    if not body.strip():
        raise Invalid("request body is empty; expected a JSON object")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise Invalid("request body is not valid UTF-8") from None
    try:
        value = json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)
    except Invalid:
        raise
    except RecursionError:
        raise Invalid(f"JSON is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, and integers too long to convert
        raise Invalid(f"request body is not valid JSON: {exc}") from None
    check_storable(value)
    return value


def check_storable(value: Any) -> None:
    """Reject what PostgreSQL jsonb cannot store: U+0000 and lone surrogates in any
    string (keys too), and nesting deeper than MAX_DEPTH (iterative: no recursion limit)."""
    stack: list[tuple[Any, str, int]] = [(value, "$", 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, dict):
            if depth > MAX_DEPTH:
                raise Invalid(f"JSON is nested deeper than {MAX_DEPTH} levels (at {path})")
            for key, child in item.items():
                _check_string(key, f"a key in {path}")
                stack.append((child, f"{path}.{key}", depth + 1))
        elif isinstance(item, list):
            if depth > MAX_DEPTH:
                raise Invalid(f"JSON is nested deeper than {MAX_DEPTH} levels (at {path})")
            stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item))
        elif isinstance(item, str):
            _check_string(item, path)


def _check_string(text: str, where: str) -> None:
    if "\x00" in text:
        raise Invalid(f"strings must not contain \\u0000 (found at {_shown(where)})")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise Invalid(f"string at {_shown(where)} holds an unpaired surrogate escape") from None


def _shown(path: str) -> str:
    return path if len(path) <= 80 else path[:77] + "..."


def _names(fields: Iterable[str]) -> str:
    return ", ".join(repr(_shown(f)) for f in sorted(fields))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def new_job(
    item: Any,
    *,
    known_types: Iterable[str],
    default_max_attempts: int,
    idempotency_key: str | None = None,
    allowed: Iterable[str] = CREATE_FIELDS,
) -> NewJob:
    """Validate one create request (already parsed JSON) into a `NewJob` with a fresh id."""
    if not isinstance(item, Mapping):
        raise Invalid("request body must be a JSON object")
    unknown = set(item) - set(allowed)
    if unknown:
        raise Invalid(f"unknown field(s): {_names(unknown)}; allowed: {', '.join(allowed)}")
    if "type" not in item:
        raise Invalid("field 'type' is required")
    job_type = item["type"]
    if not isinstance(job_type, str):
        raise Invalid("field 'type' must be a string")
    types = sorted(known_types)
    if job_type not in types:
        raise Invalid(f"unknown job type {_shown(job_type)!r}; registered: {', '.join(types)}")
    max_attempts = item.get("max_attempts", default_max_attempts)
    if not _is_int(max_attempts) or not MIN_ATTEMPTS <= max_attempts <= MAX_ATTEMPTS:
        raise Invalid(
            f"field 'max_attempts' must be an integer from {MIN_ATTEMPTS} to {MAX_ATTEMPTS}"
        )
    return NewJob(
        id=new_id(),
        type=job_type,
        payload=item.get("payload", {}),
        max_attempts=max_attempts,
        idempotency_key=idempotency_key,
    )


def new_many(body: Any, *, known_types: Iterable[str], default_max_attempts: int) -> list[NewJob]:
    """Validate a bulk create request `{"jobs": [...]}`: every item or none.

    Each item is a create request plus an optional `idempotency_key`. When any
    item is invalid, the message names every invalid item by its index.
    """
    if not isinstance(body, Mapping) or set(body) != {"jobs"}:
        raise Invalid('request body must be a JSON object {"jobs": [...]}')
    items = body["jobs"]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
        raise Invalid(f"field 'jobs' must be an array of 1 to {MAX_BATCH} job requests")
    types = sorted(known_types)
    valid: list[NewJob] = []
    problems: list[str] = []
    for index, item in enumerate(items):
        try:
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
                )
            )
        except Invalid as exc:
            problems.append(f"[{index}] {exc}")
    if problems:
        shown = "; ".join(problems[:20]) + ("; ..." if len(problems) > 20 else "")
        raise Invalid(f"{len(problems)} invalid item(s), nothing was written: {shown}")
    return valid


def idempotency_key(values: list[str]) -> str | None:
    """The `Idempotency-Key` header's value, or None if absent."""
    if not values:
        return None
    if len(values) > 1:
        raise Invalid("Idempotency-Key must be sent at most once")
    return check_key(values[0], "Idempotency-Key")


def check_key(key: Any, name: str) -> str:
    """An idempotency key (header or field) of 1–255 printable ASCII characters.

    No leading or trailing space: HTTP strips them from header values, so such a
    key could not be sent back unchanged.
    """
    if not isinstance(key, str):
        raise Invalid(f"{name} must be a string")
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise Invalid(f"{name} must be 1 to {MAX_KEY_LENGTH} characters, got {len(key)}")
    if not KEY_PATTERN.fullmatch(key):
        raise Invalid(
            f"{name} must contain only printable ASCII characters, without leading or "
            "trailing spaces"
        )
    return key
