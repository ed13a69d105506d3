"""The API reads and writes JSON with orjson only where that gives exactly what the standard
library gives: the same values of the same types, the same error messages."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobqueue_api import jsonio, validation


def _outcome(parse: Any, body: bytes) -> tuple[str, str]:
    try:
        # sort_keys and the types json.dumps shows (1 vs 1.0 vs true) make equal values equal.
        return "value", json.dumps(parse(body), sort_keys=True)
    except validation.InvalidRequest as exc:
        return "invalid", str(exc)


def _same(body: bytes) -> None:
    assert _outcome(validation.parse_json, body) == _outcome(validation.parse_json_stdlib, body)


EDGES = [
    b"",
    b"  \n",
    b'{"type": "sleep"}',
    b"18446744073709551615",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"123456789012345678901234567890",
    b"[1e400]",
    b"-1e400",
    b"1e-400",
    b"[NaN]",
    b"Infinity",
    b'{"a": 1, "a": 2}',
    b'"\\ud800"',
    b'"\\udc00\\ud800"',
    b'"\\ud83d\\ude00"',
    b'"\\u0000"',
    b'{"\\u0000": 1}',
    b"\xef\xbb\xbf{}",
    b'"\xff"',
    b"[1,]",
    b"01",
    b"1.",
    b"-0",
    b"-0.0",
    b"0.1",
    b"1E5",
    b'"\x01"',
    b'"\x7f\xe2\x80\xa8"',
    b"[" * 100 + b"]" * 100,
    b"[" * 101 + b"]" * 101,
    b"[" * 900 + b"]" * 900,
    b"[" * 1100 + b"]" * 1100,
    b'{"a": [' * 60 + b"1" + b"]}" * 60,
    b"true false",
    b"{} ",
]


@pytest.mark.parametrize("body", EDGES)
def test_edge_cases_read_as_the_standard_library_reads_them(body: bytes):
    _same(body)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(json_values, st.booleans())
def test_any_document_reads_as_the_standard_library_reads_it(value: Any, ascii_only: bool):
    _same(json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=40))
def test_any_bytes_read_as_the_standard_library_reads_them(body: bytes):
    _same(body)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_written_json_is_the_standard_librarys_document(value: Any):
    try:
        expected = json.dumps(
            value, ensure_ascii=False, allow_nan=False, separators=(",", ":")
        ).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: neither can write it
        with pytest.raises(UnicodeEncodeError):
            jsonio.dumps(value)
        return
    # Floats may be spelt differently (1e-07, 1e-7): the same numbers, the same types.
    assert json.loads(jsonio.dumps(value)) == json.loads(expected)
    assert json.dumps(json.loads(jsonio.dumps(value))) == json.dumps(json.loads(expected))
    assert json.loads(jsonio.dumps_text(value)) == json.loads(json.dumps(value))
    assert jsonio.loads(expected) == json.loads(expected)
