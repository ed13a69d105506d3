"""A handler's return value as the job's `result`: compact JSON text, checked before it is written.

A result that cannot be stored must fail its own attempt, not the batched write
it would travel in (one bad row would fail every outcome of the batch, again and
again): so it must be JSON (no NaN or infinity, no sets, no cycles), valid
UTF-8 (no lone surrogates), free of NUL characters (jsonb refuses `\\u0000`),
and at most MAX_RESULT_BYTES once encoded.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jobcore.errors import PermanentError

# An escaped NUL that is not itself an escaped backslash followed by "u0000".
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class ResultError(PermanentError):
    """The handler's return value cannot be stored as the job's result."""


def encode_result(value: Any, max_bytes: int) -> str:
    """`value` as compact JSON text; ResultError if it is not storable or too large."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
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


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc) or type(exc).__name__
