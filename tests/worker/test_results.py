"""Results: a handler's return value is stored as the job's `result` (compact JSON, None for
none); one that cannot be stored, or is over MAX_RESULT_BYTES, fails the attempt for good."""

from __future__ import annotations

import datetime as dt
import enum
import json
import math
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from jobcore import JobContext, handler, store
from jobcore.states import Operation, Status
from jobqueue_worker import executor as executor_module
from jobqueue_worker.database import PgJobStore
from jobqueue_worker.results import ResultError, encode_result
from tests.jobcore.test_store_transitions import _job_in
from tests.worker.fakestore import FakeStore
from tests.worker.stack import Stack
from tests.worker.support import submit, until


@handler("unit.result.returns")
async def returns(payload: Any, ctx: JobContext) -> Any:
    return payload["value"]


@handler("unit.result.returns-in-thread")
def returns_in_thread(payload: Any, ctx: JobContext) -> Any:
    return payload["value"]


@handler("unit.result.complex")
async def returns_a_complex(payload: Any, ctx: JobContext) -> Any:
    return 1j


@handler("unit.result.chars")
async def returns_chars(payload: Any, ctx: JobContext) -> Any:
    return "é" * payload["chars"]  # two bytes each in UTF-8


class Size(enum.Enum):
    LARGE = "L"


@handler("unit.result.converted")
def returns_converted(payload: Any, ctx: JobContext) -> Any:
    return {
        "at": dt.datetime(2026, 3, 1, 9, 5, 7, 250000, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        "naive": dt.datetime(2026, 3, 1, 9, 5),
        "day": dt.date(2026, 3, 1),
        "price": Decimal("19.90"),
        "id": UUID("0190a000-0000-7000-8000-00000000000a"),
        "size": Size.LARGE,
        "point": (1, (2, 3)),
        "tags": {"b", "a"},
        "mixed": frozenset({1}),
    }


@handler("unit.result.none")
async def returns_none(payload: Any, ctx: JobContext) -> None:
    return None


# --- encoding -----------------------------------------------------------------------


def test_results_are_compact_json_text_with_unicode_kept():
    assert encode_result({"a": [1, 2.5, None, True], "b": "é😀"}, 1000) == (
        '{"a":[1,2.5,null,true],"b":"é😀"}'
    )
    assert encode_result(0, 1) == "0"


def test_datetimes_decimals_uuids_enums_tuples_and_sets_are_converted():
    text = encode_result(returns_converted({}, None), 65536)  # type: ignore[arg-type]
    assert json.loads(text) == {
        "at": "2026-03-01T09:05:07.250000+02:00",
        "naive": "2026-03-01T09:05:00",
        "day": "2026-03-01",
        "price": "19.90",
        "id": "0190a000-0000-7000-8000-00000000000a",
        "size": "L",
        "point": [1, [2, 3]],
        "tags": ["a", "b"],
        "mixed": [1],
    }


def _cycle() -> list[Any]:
    cycle: list[Any] = []
    cycle.append(cycle)
    return cycle


def _deep() -> list[Any]:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    return deep


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (1j, "Object of type complex is not JSON serializable"),
        (object(), "Object of type object is not JSON serializable"),
        ({(1, 2): "tuple key"}, "keys must be str, int, float, bool or None"),
        (math.nan, "Out of range float values are not JSON compliant"),
        ([math.inf], "Out of range float values are not JSON compliant"),
        (_cycle(), "Circular reference detected"),
        (_deep(), "nested too deeply"),
        ("lone \udcff surrogate", "lone surrogate"),
    ],
    ids=["complex", "object", "tuple-key", "nan", "inf", "cycle", "deep", "surrogate"],
)
def test_a_value_that_is_not_json_is_refused_with_the_reason(value, says):
    with pytest.raises(ResultError) as caught:
        encode_result(value, 65536)
    assert str(caught.value).startswith("result is not JSON-serialisable: ")
    assert says in str(caught.value)


def test_a_nul_character_is_refused_but_a_backslash_and_u0000_are_text_like_any_other():
    with pytest.raises(ResultError, match="NUL"):
        encode_result({"k": "a\x00b"}, 65536)
    with pytest.raises(ResultError, match="NUL"):
        encode_result({"a\\\x00": 1}, 65536)  # an escaped backslash, then the NUL
    assert encode_result("\\u0000", 65536) == '"\\\\u0000"'


def test_the_size_limit_counts_utf8_bytes_of_the_encoded_text():
    assert encode_result("é" * 4, 10) == '"éééé"'  # 2 quotes + 4 x 2 bytes = 10
    with pytest.raises(ResultError) as caught:
        encode_result("é" * 5, 10)
    assert str(caught.value) == "result is 12 bytes, over MAX_RESULT_BYTES=10"
    with pytest.raises(ResultError) as caught:
        encode_result("x" * 69_998, 65536)
    assert str(caught.value) == "result is 70,000 bytes, over MAX_RESULT_BYTES=65536"


async def test_every_result_the_encoder_accepts_is_one_postgresql_stores(engine):
    """And the one it refuses for its NUL, PostgreSQL would refuse too (failing the whole
    batch of outcomes it was written with)."""
    tricky = ["\\u0000", "\\\\u0000", "\u2028\u2029", "😀", "\x01\x1f", "\ud7ff\ue000", ""]
    async with engine.connect() as conn:
        for value in [*tricky, {"\\u0000": [1.5, -0.0, 10**40]}]:
            text = encode_result(value, 65536)
            stored = await conn.scalar(sa.select(sa.cast(sa.literal(text, sa.Text), JSONB)))
            assert stored == value
        with pytest.raises(sa.exc.DBAPIError, match="unsupported Unicode escape sequence"):
            await conn.scalar(sa.select(sa.cast(sa.literal('"a\\u0000"', sa.Text), JSONB)))


# --- in the executor ------------------------------------------------------------------


async def _run_until_settled(store: FakeStore, **stack: Any) -> None:
    def settled() -> bool:
        return all(j.status is not Status.PROCESSING and j.attempts for j in store.jobs.values())

    async with Stack(store, **stack):
        await until(settled, 20, "every job attempted once and recorded")


async def test_a_return_value_becomes_the_result_of_async_and_plain_handlers():
    store = FakeStore()
    value = {"rows": [1, 2, 3], "name": "é"}
    async_job = store.add("unit.result.returns", {"value": value})
    thread_job = store.add("unit.result.returns-in-thread", {"value": [value]})
    await _run_until_settled(store)
    assert store.status(async_job) is store.status(thread_job) is Status.COMPLETED
    assert json.loads(store.jobs[async_job].result or "") == value
    assert json.loads(store.jobs[thread_job].result or "") == [value]


async def test_none_is_no_result_and_is_never_encoded(monkeypatch):
    def refuse(value: Any, max_bytes: int) -> str:
        raise AssertionError("None must not be encoded")

    monkeypatch.setattr(executor_module, "encode_result", refuse)
    store = FakeStore()
    job = store.add("unit.result.none")
    await _run_until_settled(store)
    assert store.status(job) is Status.COMPLETED and store.jobs[job].result is None


async def test_a_result_that_cannot_be_stored_fails_the_attempt_for_good():
    store = FakeStore()
    unserialisable = store.add("unit.result.complex", max_attempts=5)
    too_big = store.add("unit.result.chars", {"chars": 60}, max_attempts=5)
    fits = store.add("unit.result.chars", {"chars": 49}, max_attempts=5)
    await _run_until_settled(store, max_result_bytes=100)
    assert store.status(unserialisable) is Status.FAILED
    assert store.jobs[unserialisable].last_error == (
        "result is not JSON-serialisable: Object of type complex is not JSON serializable"
    )
    assert store.status(too_big) is Status.FAILED
    assert store.jobs[too_big].last_error == "result is 122 bytes, over MAX_RESULT_BYTES=100"
    assert store.jobs[unserialisable].attempts == store.jobs[too_big].attempts == 1
    assert store.status(fits) is Status.COMPLETED  # 98 bytes
    assert store.jobs[fits].result == '"' + "é" * 49 + '"'


async def test_the_worker_stores_a_converted_result():
    store = FakeStore()
    job = store.add("unit.result.converted")
    await _run_until_settled(store)
    assert store.status(job) is Status.COMPLETED
    stored = json.loads(store.jobs[job].result)
    assert stored["price"] == "19.90" and stored["tags"] == ["a", "b"] and stored["size"] == "L"


# --- in the database --------------------------------------------------------------------


async def test_results_are_written_with_the_completion_and_read_back_as_json(engine):
    async with engine.begin() as conn:
        one = await _job_in(conn, Status.PROCESSING, "complete")
        two = await _job_in(conn, Status.PROCESSING, "complete")
        three = await _job_in(conn, Status.PROCESSING, "complete")
    (queued,) = await submit(engine, "sleep", {"duration": "0s"})
    pg = PgJobStore(engine)
    try:
        lost = await pg.record(Operation.COMPLETE, [one, two], results=['{"n":1}', None])
        assert lost == []
        lost, claimed = await pg.complete_and_claim([three], {"default": 1}, 60, ['["x"]'])
        assert lost == [] and [job.id for job in claimed] == [queued]
    finally:
        await pg.close()
    async with engine.connect() as conn:
        found = {lease: await store.get(conn, lease.job_id) for lease in (one, two, three)}
    assert [job.status for job in found.values()] == [Status.COMPLETED] * 3  # type: ignore[union-attr]
    assert found[one].result == {"n": 1}  # type: ignore[union-attr]
    assert found[two].result is None  # type: ignore[union-attr]
    assert found[three].result == ["x"]  # type: ignore[union-attr]
