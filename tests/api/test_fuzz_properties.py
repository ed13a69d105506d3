"""Property tests of `POST /jobs` request validation, in process on the real database.

Whatever arrives (any JSON value, random bytes under any Content-Type, numbers of
any size, nesting of any depth, long strings, U+0000 and lone surrogates, odd
Idempotency-Key values) the answer is never a 5xx, every 4xx is `{"error": ...}`,
and a row is written exactly when the answer is 201. Where the outcome is
decidable from the input, an oracle written from docs/api.md predicts it.

Each test reuses one app and one database across its examples and compares the
row count before and after every request. `FUZZ_EXAMPLES` sets the examples per
test (the defaults keep `make test` quick; `make fuzz-deep` raises them).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore.registry import registered_types
from jobqueue_api.validation import CREATE_FIELDS, MAX_DEPTH, MAX_KEY_LENGTH
from tests.api.conftest import job_count

MAX_BODY_BYTES = 1_048_576  # the documented default
TYPES = sorted(registered_types())


def fuzz(default_examples: int) -> Any:
    examples = int(os.environ.get("FUZZ_EXAMPLES") or default_examples)
    return settings(
        max_examples=examples,
        deadline=None,
        # One app and one database serve every example of a test, on purpose.
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )


# --- sending, and the invariants every answer must keep ---------------------


async def post(
    api: httpx.AsyncClient,
    engine: AsyncEngine,
    body: bytes | AsyncIterator[bytes],
    headers: Iterable[tuple[str | bytes, str | bytes]] = (),
) -> httpx.Response:
    """POST /jobs and check what must hold for any input: no 5xx, a JSON error for every
    4xx, and exactly one new row for a 201, none otherwise."""
    before = await job_count(engine)
    r = await api.post("/jobs", content=body, headers=list(headers))
    written = await job_count(engine) - before
    assert r.status_code < 500, r.text[:500]
    if r.status_code >= 400:
        assert r.headers["content-type"] == "application/json", r.headers
        error = r.json()
        assert set(error) == {"error"} and isinstance(error["error"], str), error
    assert written == (1 if r.status_code == 201 else 0), (r.status_code, written)
    return r


def expect(r: httpx.Response, status: int, body: bytes | str) -> None:
    shown = body[:300] if len(body) > 300 else body
    assert r.status_code == status, f"{r.status_code} {r.text[:300]} for {shown!r}"


# --- the oracle -----------------------------------------------------------


def _joined(text: str) -> str:
    """`text` as a JSON parser reads it back from \\u escapes: adjacent high+low
    surrogates become one code point; unpaired ones stay."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def _text_ok(text: str, escaped: bool) -> bool:
    if "\x00" in text:
        return False
    if not escaped:  # raw surrogates are not UTF-8 at all
        return not any("\ud800" <= ch <= "\udfff" for ch in text)
    return not any("\ud800" <= ch <= "\udfff" for ch in _joined(text))


def storable(value: Any, escaped: bool, depth: int = 1) -> bool:
    """PostgreSQL jsonb can hold it and the API's limits allow it (docs/api.md)."""
    if isinstance(value, dict):
        return depth <= MAX_DEPTH and all(
            _text_ok(k, escaped) and storable(v, escaped, depth + 1) for k, v in value.items()
        )
    if isinstance(value, list):
        return depth <= MAX_DEPTH and all(storable(v, escaped, depth + 1) for v in value)
    if isinstance(value, str):
        return _text_ok(value, escaped)
    if isinstance(value, float):
        return math.isfinite(value)
    return True


QUEUE_FIRST = "abcdefghijklmnopqrstuvwxyz0123456789"
QUEUE_CHARS = QUEUE_FIRST + "_.-"
UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
DELAY_RANGE, TIMEOUT_RANGE = (0.0, 366 * 86400.0), (1.0, 86400.0)
LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
_ASCII_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)")
_STAMP = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))"
)


def queue_ok(value: Any) -> bool:
    """docs/api.md: 1 to 63 of a-z 0-9 _ . -, starting with a letter or digit."""
    return (
        isinstance(value, str)
        and 1 <= len(value) <= 63
        and value[0] in QUEUE_FIRST
        and all(ch in QUEUE_CHARS for ch in value)
    )


def seconds_of(value: Any) -> float | None:
    """A duration's seconds (docs/api.md: a JSON number, or a Go duration or decimal seconds
    as a string), or None when it is not a duration at all."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return float(value) if abs(value) < 10**300 else None
    if isinstance(value, float):
        return value
    if not isinstance(value, str):
        return None
    if _ASCII_NUMBER.fullmatch(value):
        return float(value)
    parts = _PART.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        return None
    total = sum(float(n) * UNITS[u] for n, u in parts)
    return total if math.isfinite(total) else None


def duration_ok(value: Any, limits: tuple[float, float]) -> bool:
    seconds = seconds_of(value)
    return seconds is not None and limits[0] <= seconds <= limits[1]


def due_at(value: Any) -> datetime | None:
    """The UTC instant an RFC 3339 run_at names (microseconds), None if it is refused.
    Times before year 1 in UTC stand for "long ago": 1970-01-01."""
    match = _STAMP.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, sign, off_h, off_m = match.groups()
    if int(off_h or 0) > 23 or int(off_m or 0) > 59 or int(second) > 60:
        return None
    try:
        local = datetime(int(year), int(month), int(day), int(hour), int(minute), tzinfo=UTC)
    except ValueError:
        return None
    offset = timedelta(hours=int(off_h or 0), minutes=int(off_m or 0))
    shift = timedelta(
        seconds=int(second), microseconds=int((fraction or ".")[1:7].ljust(6, "0"))
    ) - (-offset if sign == "-" else offset)
    try:
        due = local + shift
    except OverflowError:
        return datetime(1970, 1, 1, tzinfo=UTC) if shift < timedelta(0) else None
    return due if due <= LATEST else None


def scheduling_ok(value: dict[str, Any]) -> bool:
    if "run_at" in value and "delay" in value:
        return False
    checks = {
        "queue": queue_ok,
        "priority": lambda v: type(v) is int and -100 <= v <= 100,
        "run_at": lambda v: due_at(v) is not None,
        "delay": lambda v: duration_ok(v, DELAY_RANGE),
        "timeout": lambda v: duration_ok(v, TIMEOUT_RANGE),
    }
    return all(check(value[name]) for name, check in checks.items() if name in value)


def accepted(value: Any, escaped: bool) -> bool:
    """A valid create request (docs/api.md, "Jobs") that can be stored."""
    if not isinstance(value, dict) or not set(value) <= set(CREATE_FIELDS):
        return False
    if not (isinstance(value.get("type"), str) and value["type"] in TYPES):
        return False
    if "max_attempts" in value:
        attempts = value["max_attempts"]
        if type(attempts) is not int or not 1 <= attempts <= 100:
            return False
    return storable(value, escaped) and scheduling_ok(value)


def encode(value: Any, escaped: bool) -> bytes:
    """JSON text; non-ASCII as \\u escapes, or raw UTF-8 (lone surrogates then yield
    bytes that are not UTF-8, as a broken client would send)."""
    return json.dumps(value, ensure_ascii=escaped).encode("utf-8", "surrogatepass")


# --- strategies -----------------------------------------------------------

EDGE_CHARS = [
    "\x00",  # jsonb cannot store it
    "\ud800",  # lone high surrogate
    "\udbff",
    "\udc00",  # lone low surrogate
    "\udfff",
    "\ud83d",  # followed by the next one: a valid pair when escaped
    "\ude00",
    "\ufeff",  # byte order mark
    "\u2028",  # line and paragraph separators (invalid in JavaScript strings)
    "\u2029",
    "\ufffe",  # noncharacters
    "\uffff",
    "\U0010ffff",
    "\U0001f600",
    "\u0085",
    "\u00a0",
    "\u202e",  # right-to-left override
    "\u0301",  # combining mark
    "\x7f",
    "\x1f",
    '"',
    "\\",
    "/",
    "é",
]
chars = st.one_of(st.characters(codec=None), st.sampled_from(EDGE_CHARS))
texts = st.text(chars, max_size=16)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), texts)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=16,
)
queues = st.one_of(
    st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,62}", fullmatch=True),
    st.sampled_from(["", "q" * 64, "Default", "-a", "_a", ".a", "a b", "a\n", "été", "a\x00"]),
    texts,
    scalars,
)
priorities = st.one_of(st.integers(-101, 101), st.sampled_from([3.0, -0.0, True]), scalars)
_stamp_parts = st.tuples(
    st.one_of(st.integers(0, 10000), st.sampled_from([1, 1970, 2000, 2100, 9999])),
    st.integers(0, 13),
    st.integers(0, 32),
    st.integers(0, 25),
    st.integers(0, 61),
    st.integers(0, 61),
    st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=9).map(".".__add__)),
    st.sampled_from(["T", "t", " ", "_"]),
    st.one_of(
        st.sampled_from(["Z", "z", "", "+0100", "+01", "Z "]),
        st.builds(
            "{}{:02d}:{:02d}".format,
            st.sampled_from("+-"),
            st.integers(0, 25),
            st.integers(0, 61),
        ),
    ),
)
timestamps = st.one_of(
    _stamp_parts.map(
        lambda p: (
            f"{p[0]:04d}-{p[1]:02d}-{p[2]:02d}{p[7]}{p[3]:02d}:{p[4]:02d}:{p[5]:02d}{p[6]}{p[8]}"
        )
    ),
    st.datetimes(timezones=st.timezones()).map(datetime.isoformat),
    texts,
    scalars,
)
_go_duration = st.lists(
    st.tuples(
        st.one_of(
            st.integers(0, 100_000).map(str),
            st.decimals(0, 10_000, places=3).map(str),
            st.sampled_from([".5", "5.", "1" * 400, "00"]),
        ),
        st.sampled_from(list(UNITS)),
    ),
    min_size=1,
    max_size=3,
).map(lambda parts: "".join(n + u for n, u in parts))
ODD_DURATIONS = [
    "1e3",
    "inf",
    "nan",
    "-5s",
    "+5s",
    " 5s",
    "5 s",
    "5d",
    "",
    "s",
    "٣s",
    "1_0",
    "5s\n",
]
durations = st.one_of(
    _go_duration,
    st.integers(-2, 40_000_000),
    st.floats(-1, 40_000_000),
    st.sampled_from(ODD_DURATIONS),
    st.sampled_from([0, 1, 86400, 86400.001, 0.999, 366 * 86400, 366 * 86400 + 1, 10**400]),
    texts,
    scalars,
)
scheduling_fields = st.fixed_dictionaries(
    {},
    optional={
        "queue": queues,
        "priority": priorities,
        "run_at": timestamps,
        "delay": durations,
        "timeout": durations,
    },
)


def _go(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60}m{rest % 60}s"


def _durations_within(low: int, high: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.integers(low, high),
        st.floats(low, high),
        st.integers(low, high).map(_go),
        st.integers(low * 1000, high * 1000).map("{}ms".format),
        st.decimals(low, high, places=2).map(str),
    )


_offsets = st.one_of(
    st.sampled_from(["Z", "z", "+00:00", "-00:00"]),
    st.builds(
        "{}{:02d}:{:02d}".format, st.sampled_from("+-"), st.integers(0, 23), st.integers(0, 59)
    ),
)
valid_run_at = st.builds(
    lambda moment, sep, offset: moment.isoformat(sep) + offset,
    st.datetimes(datetime(1, 1, 2), datetime(9999, 12, 30)),
    st.sampled_from("Tt"),
    _offsets,
)
# Every field valid: a wild one added to these then decides the answer alone.
valid_scheduling = st.builds(
    lambda fields, when: {**fields, **when},
    st.fixed_dictionaries(
        {},
        optional={
            "queue": st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,62}", fullmatch=True),
            "priority": st.integers(-100, 100),
            "timeout": _durations_within(1, 86400),
        },
    ),
    st.one_of(
        st.just({}),
        valid_run_at.map(lambda v: {"run_at": v}),
        _durations_within(0, 366 * 86400).map(lambda v: {"delay": v}),
    ),
)
naive_run_at = st.datetimes(datetime(1, 1, 2), datetime(9999, 12, 30)).map(datetime.isoformat)
wild_durations = st.one_of(st.sampled_from(ODD_DURATIONS), durations)
wild_field = st.one_of(
    queues.map(lambda v: {"queue": v}),
    st.one_of(st.sampled_from([True, False, 3.0, -0.0, "1"]), priorities).map(
        lambda v: {"priority": v}
    ),
    st.one_of(naive_run_at, timestamps, valid_run_at.map(lambda v: v[:-1])).map(
        lambda v: {"run_at": v}
    ),
    wild_durations.map(lambda v: {"delay": v}),
    wild_durations.map(lambda v: {"timeout": v}),
)
# Half of them all valid, half with one wild field.
mostly_valid_scheduling = st.builds(
    lambda valid, wild: {**valid, **wild},
    valid_scheduling,
    st.booleans().flatmap(lambda wild: wild_field if wild else st.just({})),
)
create_requests = st.builds(
    lambda fields, scheduling, extra: {**fields, **scheduling, **extra},
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.one_of(st.sampled_from(TYPES), texts, scalars),
            "payload": json_values,
            "max_attempts": st.one_of(st.integers(0, 101), scalars),
        },
    ),
    scheduling_fields,
    st.dictionaries(texts.filter(lambda k: k not in CREATE_FIELDS), json_values, max_size=2)
    | st.just({}),
)
content_types = st.sampled_from(
    [
        None,
        "application/json",
        "application/x-www-form-urlencoded",  # what `curl -d` sends
        "text/plain",
        "multipart/form-data; boundary=xyz",
        "application/json; charset=latin-1",
    ]
)


def with_type(content_type: str | None) -> list[tuple[str | bytes, str | bytes]]:
    return [] if content_type is None else [("Content-Type", content_type)]


# --- properties -------------------------------------------------------------


@fuzz(80)
@given(value=st.one_of(json_values, create_requests), escaped=st.booleans(), ctype=content_types)
async def test_any_json_body_is_created_exactly_when_it_is_a_valid_storable_request(
    api: httpx.AsyncClient, engine: AsyncEngine, value: Any, escaped: bool, ctype: str | None
) -> None:
    body = encode(value, escaped)
    r = await post(api, engine, body, with_type(ctype))
    if len(body) <= MAX_BODY_BYTES:
        expect(r, 201 if accepted(value, escaped) else 400, body)


def _mutate(body: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    data = bytearray(body)
    for kind, where, byte in edits:
        at = where % (len(data) + 1)
        if kind == 0:
            data.insert(at, byte)
        elif data and kind == 1:
            del data[at % len(data)]
        elif data:
            data[at % len(data)] = byte
    return bytes(data)


VALID_BODY = (
    b'{"type": "sleep", "payload": {"duration": "1s", "k": [1, 2.5, null]}, "max_attempts": 3}'
)

arbitrary_bodies = st.one_of(
    st.binary(max_size=512),
    st.builds(
        _mutate,
        st.just(VALID_BODY),
        st.lists(
            st.tuples(st.integers(0, 2), st.integers(0, 10_000), st.integers(0, 255)),
            min_size=1,
            max_size=6,
        ),
    ),
    # a real form body, as a browser or `curl --data-urlencode` would send it
    st.dictionaries(texts, texts, max_size=4).map(
        lambda form: urlencode(form, encoding="utf-8", errors="surrogatepass").encode()
    ),
)


@fuzz(80)
@given(body=arbitrary_bodies, ctype=content_types)
async def test_random_bytes_never_cause_a_server_error_or_a_write(
    api: httpx.AsyncClient, engine: AsyncEngine, body: bytes, ctype: str | None
) -> None:
    r = await post(api, engine, body, with_type(ctype))
    assert r.status_code in (201, 400), r.text[:300]


def _digits(first: str, rest: str, count: int) -> str:
    return first + (rest * count)[:count]


integer_literals = st.builds(
    lambda sign, first, rest, count: sign + _digits(first, rest, count),
    st.sampled_from(["", "-"]),
    st.sampled_from("123456789"),
    st.text("0123456789", min_size=1, max_size=7),
    st.one_of(
        st.integers(0, 30), st.integers(300, 320), st.integers(4290, 4310), st.integers(0, 6000)
    ),
)
float_literals = st.one_of(
    st.builds(
        lambda mantissa, sign, exponent: f"{mantissa}e{sign}{exponent}",
        st.sampled_from(["1", "-1", "9.99", "0.5", "2.2250738585072014", "1.7976931348623157"]),
        st.sampled_from(["", "+", "-"]),
        st.one_of(st.integers(0, 400), st.sampled_from([307, 308, 309, 323, 324, 325, 10**20])),
    ),
    st.builds(
        lambda ints, fraction: f"{ints}.{fraction}",
        integer_literals,
        st.text("0123456789", min_size=1, max_size=50),
    ),
    st.builds(lambda zeros: "0." + "0" * zeros + "1", st.integers(0, 2000)),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)


def _is_integer_literal(text: str) -> bool:
    return not any(c in text for c in ".eE")


def number_is_storable(text: str) -> bool:
    if _is_integer_literal(text):
        return len(text.lstrip("-")) <= sys.get_int_max_str_digits()
    return math.isfinite(float(text))


@fuzz(60)
@given(
    number=st.one_of(integer_literals, float_literals),
    where=st.sampled_from(
        ["payload", "nested", "max_attempts", "type", "priority", "delay", "timeout"]
    ),
)
async def test_numbers_of_any_size_are_stored_exactly_or_rejected_cleanly(
    api: httpx.AsyncClient, engine: AsyncEngine, number: str, where: str
) -> None:
    shape = {
        "payload": '{"type": "sleep", "payload": %s}',
        "nested": '{"type": "sleep", "payload": {"a": [0, {"n": %s}]}}',
        "max_attempts": '{"type": "sleep", "max_attempts": %s}',
        "type": '{"type": %s}',
        "priority": '{"type": "sleep", "priority": %s}',
        "delay": '{"type": "sleep", "delay": %s}',
        "timeout": '{"type": "sleep", "timeout": %s}',
    }[where]
    body = (shape % number).encode()
    r = await post(api, engine, body)
    limits = {"max_attempts": (1, 100), "priority": (-100, 100)}
    if where in limits:
        low, high = limits[where]
        ok = (
            _is_integer_literal(number)
            and number_is_storable(number)
            and low <= int(number) <= high
        )
    elif where in ("delay", "timeout"):
        low, high = DELAY_RANGE if where == "delay" else TIMEOUT_RANGE
        ok = number_is_storable(number) and low <= float(number) <= high
    else:
        ok = where != "type" and number_is_storable(number)
    expect(r, 201 if ok else 400, body)
    if ok and where in ("priority", "timeout"):
        assert r.json()[where] == json.loads(number)
    if ok and where == "payload" and _is_integer_literal(number):
        assert r.json()["payload"] == int(number)  # big integers survive jsonb exactly


def nested(kind: str, levels: int, closed: bool) -> tuple[bytes, int]:
    """A JSON value nested `levels` times (pairs of levels for "mixed") and its depth."""
    opening, leaf, closing, per_level = {
        "array": (b"[", b"", b"]", 1),
        "object": (b'{"a":', b"1", b"}", 1),
        "mixed": (b'[{"a":', b"1", b"}]", 2),
    }[kind]
    return opening * levels + leaf + (closing * levels if closed else b""), levels * per_level


@fuzz(40)
@given(
    kind=st.sampled_from(["array", "object", "mixed"]),
    levels=st.one_of(st.integers(1, MAX_DEPTH + 2), st.integers(MAX_DEPTH, 200_000)),
    closed=st.booleans(),
    where=st.sampled_from(["payload", "body", "max_attempts"]),
)
async def test_nesting_is_accepted_up_to_the_limit_and_rejected_beyond_at_any_depth(
    api: httpx.AsyncClient, engine: AsyncEngine, kind: str, levels: int, closed: bool, where: str
) -> None:
    value, depth = nested(kind, levels, closed)
    body = {
        "payload": b'{"type": "sleep", "payload": ' + value + b"}",
        "body": value,
        "max_attempts": b'{"type": "sleep", "max_attempts": ' + value + b"}",
    }[where]
    r = await post(api, engine, body)
    if len(body) > MAX_BODY_BYTES:
        expect(r, 413, body)
    else:
        # the payload sits one level below the request object
        ok = closed and where == "payload" and depth + 1 <= MAX_DEPTH
        expect(r, 201 if ok else 400, body)


async def _chunks(body: bytes, size: int = 65_536) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


@fuzz(30)
@given(
    char=st.one_of(st.sampled_from(EDGE_CHARS), st.sampled_from(["a", " ", "ß", "\u4e2d"])),
    length=st.one_of(
        st.integers(0, 300), st.integers(200_000, 360_000), st.integers(1_000_000, 1_100_000)
    ),
    where=st.sampled_from(["value", "key", "type"]),
    escaped=st.booleans(),
    streamed=st.booleans(),
)
async def test_long_strings_are_stored_whole_or_refused_without_a_write(
    api: httpx.AsyncClient,
    engine: AsyncEngine,
    char: str,
    length: int,
    where: str,
    escaped: bool,
    streamed: bool,
) -> None:
    text = ("x" + char) * (length // 2)
    request: dict[str, Any] = {
        "value": {"type": "sleep", "payload": {"k": text}},
        "key": {"type": "sleep", "payload": {text: 1}},
        "type": {"type": text},
    }[where]
    body = encode(request, escaped)
    # Streamed: no Content-Length, so the limit must hold while the body is read.
    r = await post(api, engine, _chunks(body) if streamed else body)
    if len(body) > MAX_BODY_BYTES:
        expect(r, 413, body)
        return
    ok = accepted(request, escaped)
    expect(r, 201 if ok else 400, body)
    if ok:
        assert r.json()["payload"] == json.loads(body)["payload"]  # stored whole, unaltered


@fuzz(60)
@given(
    payload=st.dictionaries(texts, st.one_of(texts, st.lists(texts, max_size=3)), max_size=4),
    type_=st.one_of(st.sampled_from(TYPES), texts),
    escaped=st.booleans(),
)
async def test_unicode_in_keys_and_values_round_trips_or_is_a_400(
    api: httpx.AsyncClient, engine: AsyncEngine, payload: Any, type_: str, escaped: bool
) -> None:
    request = {"type": type_, "payload": payload}
    body = encode(request, escaped)
    r = await post(api, engine, body, [("Content-Type", "application/json")])
    ok = accepted(request, escaped)
    expect(r, 201 if ok else 400, body)
    if ok:
        assert r.json()["payload"] == json.loads(body)["payload"]
        stored = await api.get(f"/jobs/{r.json()['id']}")
        assert stored.json()["payload"] == json.loads(body)["payload"]


def key_is_valid(raw: bytes) -> bool:
    """docs/api.md, "Idempotency": 1–255 printable characters (ASCII; edges not blank,
    which HTTP would strip)."""
    return (
        1 <= len(raw) <= MAX_KEY_LENGTH
        and all(0x20 <= b <= 0x7E for b in raw)
        and raw[0] != 0x20
        and raw[-1] != 0x20
    )


header_values = st.one_of(
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=300).map(str.encode),
    st.integers(250, 260).map(lambda n: b"k" * n),
    # anything a client could put on the wire: not CR, LF or NUL
    st.binary(max_size=40).map(lambda b: b.translate(None, b"\r\n\x00")),
    texts.map(lambda t: t.encode("utf-8", "surrogatepass").translate(None, b"\r\n\x00")),
)
PAYLOADS = [
    b'{"a": 1, "b": ["x", "\\u00e9"]}',
    b'{"b":["x","\xc3\xa9"],"a":1}',  # the same as jsonb: other key order, raw UTF-8
    b'{"a": 2, "b": ["x", "\\u00e9"]}',
]


@pytest.fixture
def seen_keys() -> dict[bytes, tuple[int, str]]:
    """Keys used so far in this test's database: which payload each was first sent with, and
    the job it created. Shared by every example, like the database."""
    return {}


@fuzz(80)
@given(
    keys=st.lists(
        st.tuples(header_values, st.integers(0, 2), st.booleans()), min_size=1, max_size=4
    )
)
async def test_idempotency_key_creates_once_replays_or_conflicts_and_bad_keys_write_nothing(
    api: httpx.AsyncClient,
    engine: AsyncEngine,
    seen_keys: dict[bytes, tuple[int, str]],
    keys: list[tuple[bytes, int, bool]],
) -> None:
    # Keys repeat within and across examples, which is the point: the first use
    # creates, the same request replays, a different one conflicts.
    seen = seen_keys
    for key, which, twice in keys:
        body = b'{"type": "sleep", "payload": ' + PAYLOADS[which] + b"}"
        headers = [("Idempotency-Key", key)] * (2 if twice else 1)
        r = await post(api, engine, body, headers)
        if twice or not key_is_valid(key):
            expect(r, 400, key)
        elif key not in seen:
            expect(r, 201, key)
            seen[key] = (which, r.json()["id"])
        else:
            first, job_id = seen[key]
            same = first == which or {first, which} == {0, 1}
            expect(r, 200 if same else 409, key)
            if same:
                assert r.json()["id"] == job_id


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@fuzz(200)
@given(fields=mostly_valid_scheduling)
async def test_scheduling_fields_are_accepted_exactly_when_valid_and_stored_as_given(
    api: httpx.AsyncClient, engine: AsyncEngine, fields: dict[str, Any]
) -> None:
    request = {"type": "sleep", **fields}
    body = encode(request, escaped=True)
    r = await post(api, engine, body)
    ok = accepted(request, escaped=True)
    expect(r, 201 if ok else 400, body)
    if not ok:
        if storable(request, escaped=True):
            assert any(f"field '{name}'" in r.json()["error"] for name in fields), r.text
        return
    job = r.json()
    assert job["queue"] == fields.get("queue", "default")
    assert job["priority"] == fields.get("priority", 0)
    assert job["timeout"] == (seconds_of(fields["timeout"]) if "timeout" in fields else None)
    run_at, created = _instant(job["run_at"]), _instant(job["created_at"])
    if "delay" in fields:
        delay = timedelta(seconds=seconds_of(fields["delay"]) or 0.0)
        assert abs(run_at - created - delay) <= timedelta(microseconds=1), (run_at, created)
    elif "run_at" in fields:
        due = due_at(fields["run_at"])
        assert due is not None and run_at == max(created, due), (run_at, created, due)
    else:
        assert run_at == created
