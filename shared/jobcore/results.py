"""A handler's return value as the job's `result`: compact JSON text, checked before it is written.

The one encoder of results: the worker stores what it writes, and `jobcore.testing` returns
what it writes decoded again. Besides JSON's own types it converts a `datetime` or `date` to
its RFC 3339 / ISO 8601 text (`isoformat()`), a `Decimal` and a `UUID` to their text, an
`Enum` member to its value, and tuples and sets to arrays (a set sorted when its items
compare, so the same set stores the same text). Anything else is refused.

A result that cannot be stored must fail its own attempt, not the batched write
it would travel in (one bad row would fail every outcome of the batch, again and
again): so it must be JSON (no NaN or infinity, no sets, no cycles), valid
UTF-8 (no lone surrogates), free of NUL characters (jsonb refuses `\\u0000`),
and at most MAX_RESULT_BYTES once encoded.
"""

from __future__ import annotations

import json
import re
from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID

from jobcore.errors import PermanentError

# An escaped NUL that is not itself an escaped backslash followed by "u0000".
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class ResultError(PermanentError):
    """The handler's return value cannot be stored as the job's result."""


def encode_result(value: Any, max_bytes: int) -> str:
    """`value` as compact JSON text; ResultError if it is not storable or too large."""
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ResultError(f"result is not JSON-serialisable: {_reason(exc)}") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ResultError(
            "result is not JSON-serialisable: a string holds a lone surrogate (not valid Unicode)"
        ) from None
    if size > max_bytes:
        raise ResultError(f"result is {size:,} bytes, over MAX_RESULT_BYTES={max_bytes}")
    if "\\u0000" in text and _NUL.search(text):
        raise ResultError(
            "result is not storable: a string holds a NUL character (\\u0000), which"
            " PostgreSQL's jsonb refuses"
        )
    return text


def decode_result(text: str) -> Any:
    """A stored result's JSON text as the value a reader of the job gets."""
    return json.loads(text)


def _converted(value: Any) -> Any:
    """What JSON cannot write itself, as `json.JSONEncoder.default` turns it into JSON's
    types (TypeError for anything else, which the encoder reports)."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal | UUID):
        return str(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, set | frozenset):
        try:
            return sorted(value)
        except TypeError:  # items that do not compare: in the set's own order
            return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# One encoder for every result: json.dumps with arguments would build one per call.
_ENCODER = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_converted
)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc) or type(exc).__name__
