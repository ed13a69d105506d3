"""JSON on the hot path with orjson, and the standard library wherever orjson would not give
exactly what it gives.

orjson is several times faster, but it differs from `json` at the edges: it reads an
integer beyond 64 bits as a float (silently), refuses lone surrogates and integers beyond
64 bits on output, writes NaN and the infinities as null (`json` refuses them), and writes
some floats differently (1e-7, not 1e-07; the same number). So every reader here hands
anything with a run of 19 or more digits (the only way to spell an integer beyond 64 bits)
to `json`, and every writer falls back to `json` where orjson refuses. No value the API
writes can hold a NaN or an infinity: request bodies refuse them and jsonb cannot store them.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import orjson

# 18 digits always fit in 64 bits; 19 may not. A float's long mantissa, or a long number in
# a string, takes the slow path too, which reads it the same.
_LONG_NUMBER = re.compile(rb"[0-9]{19}")
_LONG_NUMBER_TEXT = re.compile(r"[0-9]{19}")


# What `parse` returns when orjson cannot be trusted with a document: read it with `json`.
# (A value, not an exception: it is no error, and it never leaves the caller.)
FALLBACK: Final = object()


def parse(body: bytes) -> Any:
    """The document in `body` as `json.loads` would read it, or FALLBACK: then only
    `json.loads` can tell (a long number, or a document orjson refuses, whose error message
    must be `json`'s)."""
    if _LONG_NUMBER.search(body) is not None:
        return FALLBACK
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return FALLBACK


def loads(text: str | bytes) -> Any:
    """`json.loads(text)`, faster (the API's jsonb decoder: payloads and results)."""
    long = _LONG_NUMBER.search(text) if isinstance(text, bytes) else _LONG_NUMBER_TEXT.search(text)
    if long is None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


def dumps(value: Any) -> bytes:
    """`value` as a response body: what Starlette's JSONResponse renders, faster."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError: an integer beyond 64 bits, a lone surrogate
        return json.dumps(
            value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
        ).encode("utf-8")


def dumps_text(value: Any) -> str:
    """`value` as JSON text, for a jsonb parameter."""
    try:
        return orjson.dumps(value).decode("utf-8")
    except TypeError:
        return json.dumps(value)
