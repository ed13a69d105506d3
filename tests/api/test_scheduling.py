"""The scheduling and routing fields of a create request (queue, priority, run_at or delay,
timeout) through `POST /jobs` and `POST /jobs/batch`, on the real database."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore.schema import jobs
from tests.api.conftest import job_count


async def _row(engine: AsyncEngine, job_id: str) -> Any:
    async with engine.connect() as conn:
        query = sa.select(
            jobs.c.queue,
            jobs.c.priority,
            jobs.c.timeout,
            jobs.c.run_at,
            jobs.c.created_at,
        ).where(jobs.c.id == uuid.UUID(job_id))
        return (await conn.execute(query)).one()


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# field value as sent -> (column, value stored)
VALID = [
    ("queue", "default", "queue", "default"),
    ("queue", "a", "queue", "a"),
    ("queue", "0", "queue", "0"),
    ("queue", "q" * 63, "queue", "q" * 63),
    ("queue", "emails.eu-west_2", "queue", "emails.eu-west_2"),
    ("priority", -100, "priority", -100),
    ("priority", 100, "priority", 100),
    ("priority", 0, "priority", 0),
    ("timeout", 1, "timeout", 1.0),
    ("timeout", "1s", "timeout", 1.0),
    ("timeout", "1000ms", "timeout", 1.0),
    ("timeout", 86400, "timeout", 86400.0),
    ("timeout", "24h", "timeout", 86400.0),
    ("timeout", "1m30s", "timeout", 90.0),
    ("timeout", 2.5, "timeout", 2.5),
    ("timeout", "2.5", "timeout", 2.5),
    ("timeout", "1.5h", "timeout", 5400.0),
    ("timeout", "1500000us", "timeout", 1.5),
    ("timeout", "1500000µs", "timeout", 1.5),
    ("timeout", "1000000000ns", "timeout", 1.0),
]


async def test_valid_edge_values_are_accepted_shown_and_stored(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    failures = []
    for field, sent, column, stored in VALID:
        r = await api.post("/jobs", json={"type": "sleep", field: sent})
        if r.status_code != 201:
            failures.append(f"{field}={sent!r}: {r.status_code} {r.text[:200]}")
            continue
        row = await _row(engine, r.json()["id"])
        if r.json()[column] != stored or getattr(row, column) != stored:
            failures.append(f"{field}={sent!r}: shown {r.json()[column]!r}, stored {row}")
    assert failures == []


# body fields -> the field the 400 must name
INVALID: list[tuple[dict[str, Any], str]] = [
    ({"queue": ""}, "'queue'"),
    ({"queue": "q" * 64}, "'queue'"),
    ({"queue": "Default"}, "'queue'"),
    ({"queue": "-a"}, "'queue'"),
    ({"queue": "_a"}, "'queue'"),
    ({"queue": ".a"}, "'queue'"),
    ({"queue": "a b"}, "'queue'"),
    ({"queue": "a/b"}, "'queue'"),
    ({"queue": "a\n"}, "'queue'"),
    ({"queue": "\u00e9t\u00e9"}, "'queue'"),
    ({"queue": 1}, "'queue'"),
    ({"queue": None}, "'queue'"),
    ({"queue": ["a"]}, "'queue'"),
    ({"priority": 101}, "'priority'"),
    ({"priority": -101}, "'priority'"),
    ({"priority": 10**40}, "'priority'"),
    ({"priority": True}, "'priority'"),
    ({"priority": 3.0}, "'priority'"),
    ({"priority": "3"}, "'priority'"),
    ({"priority": None}, "'priority'"),
    ({"run_at": "2026-12-01T09:30:00"}, "'run_at'"),
    ({"run_at": "2026-12-01T09:30:00.5"}, "'run_at'"),
    ({"run_at": "2026-12-01"}, "'run_at'"),
    ({"run_at": "2026-12-01 09:30:00Z"}, "'run_at'"),
    ({"run_at": "2026-12-01T09:30Z"}, "'run_at'"),
    ({"run_at": "2026-12-01T09:30:00+0100"}, "'run_at'"),
    ({"run_at": "2026-12-01T09:30:00+01"}, "'run_at'"),
    ({"run_at": "20261201T093000Z"}, "'run_at'"),
    ({"run_at": "2026-12-01T09:30:00Z "}, "'run_at'"),
    ({"run_at": "2026-12-01T09:30:00Z\n"}, "'run_at'"),
    ({"run_at": "2026-02-30T09:30:00Z"}, "'run_at'"),
    ({"run_at": "2026-13-01T09:30:00Z"}, "'run_at'"),
    ({"run_at": "2026-12-01T24:00:00Z"}, "'run_at'"),
    ({"run_at": "2026-12-01T09:60:00Z"}, "'run_at'"),
    ({"run_at": "2026-12-01T09:30:61Z"}, "'run_at'"),
    ({"run_at": "2026-12-01T09:30:00+24:00"}, "'run_at'"),
    ({"run_at": "2026-12-01T09:30:00+01:60"}, "'run_at'"),
    ({"run_at": "0000-12-01T09:30:00Z"}, "'run_at'"),
    ({"run_at": "9999-12-31T23:00:00-01:00"}, "'run_at'"),
    ({"run_at": "9999-12-31T23:59:60Z"}, "'run_at'"),
    ({"run_at": "9999-12-31T23:59:59.000001Z"}, "'run_at'"),
    ({"run_at": "9999-12-31T23:59:59.999999Z"}, "'run_at'"),
    ({"run_at": "tomorrow"}, "'run_at'"),
    ({"run_at": 1_800_000_000}, "'run_at'"),
    ({"run_at": None}, "'run_at'"),
    ({"delay": -1}, "'delay'"),
    ({"delay": -0.001}, "'delay'"),
    ({"delay": 366 * 86400 + 1}, "'delay'"),
    ({"delay": "8785h"}, "'delay'"),
    ({"delay": "8784h1s"}, "'delay'"),
    ({"delay": "-5s"}, "'delay'"),
    ({"delay": "+5s"}, "'delay'"),
    ({"delay": "5 s"}, "'delay'"),
    ({"delay": " 5s"}, "'delay'"),
    ({"delay": "5d"}, "'delay'"),
    ({"delay": "1e3"}, "'delay'"),
    ({"delay": "inf"}, "'delay'"),
    ({"delay": "nan"}, "'delay'"),
    ({"delay": "1_000"}, "'delay'"),
    ({"delay": "\u0663s"}, "'delay'"),  # ARABIC-INDIC DIGIT THREE
    ({"delay": ""}, "'delay'"),
    ({"delay": "s"}, "'delay'"),
    ({"delay": "."}, "'delay'"),
    ({"delay": 10**400}, "'delay'"),
    ({"delay": True}, "'delay'"),
    ({"delay": None}, "'delay'"),
    ({"delay": {"seconds": 5}}, "'delay'"),
    ({"timeout": 0}, "'timeout'"),
    ({"timeout": 0.999}, "'timeout'"),
    ({"timeout": "999ms"}, "'timeout'"),
    ({"timeout": "0s"}, "'timeout'"),
    ({"timeout": 86400.001}, "'timeout'"),
    ({"timeout": "24h1ms"}, "'timeout'"),
    ({"timeout": "25h"}, "'timeout'"),
    ({"timeout": -5}, "'timeout'"),
    ({"timeout": False}, "'timeout'"),
    ({"timeout": None}, "'timeout'"),
    ({"run_at": "2026-12-01T09:30:00Z", "delay": 5}, "'run_at' or field 'delay'"),
    ({"run_at": "2026-12-01T09:30:00Z", "delay": "0s"}, "'run_at' or field 'delay'"),
]


async def test_each_invalid_value_is_400_naming_the_field_and_writes_nothing(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    failures = []
    for fields, named in INVALID:
        r = await api.post("/jobs", json={"type": "sleep", **fields})
        if r.status_code != 400 or named not in r.json().get("error", ""):
            failures.append(f"{fields!r}: {r.status_code} {r.text[:200]}")
    assert failures == []
    assert await job_count(engine) == 0


async def test_a_timestamp_without_an_offset_is_refused_saying_so(api: httpx.AsyncClient):
    r = await api.post("/jobs", json={"type": "sleep", "run_at": "2030-01-01T00:00:00"})
    assert r.status_code == 400
    assert r.json()["error"].startswith("field 'run_at' has no offset")


async def test_the_record_shows_queue_priority_and_timeout_with_their_defaults(
    api: httpx.AsyncClient,
):
    plain = (await api.post("/jobs", json={"type": "sleep"})).json()
    assert (plain["queue"], plain["priority"], plain["timeout"]) == ("default", 0, None)
    routed = (
        await api.post(
            "/jobs", json={"type": "sleep", "queue": "mail", "priority": 7, "timeout": "1m30s"}
        )
    ).json()
    assert (routed["queue"], routed["priority"], routed["timeout"]) == ("mail", 7, 90.0)
    assert (await api.get(f"/jobs/{routed['id']}")).json() == {**routed, "errors": []}
    status = (await api.get(f"/jobs/{routed['id']}/status")).json()
    assert set(status) == {"id", "status", "attempts", "max_attempts", "run_at", "last_error"}


async def test_run_at_in_the_past_is_stored_as_the_databases_now(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    # created_at is the inserting transaction's now(): a past run_at must be exactly that.
    for past in ("2001-02-03T04:05:06Z", "0001-01-01T00:00:00+23:59", "1970-01-01T00:00:00-00:00"):
        r = await api.post("/jobs", json={"type": "sleep", "run_at": past})
        assert r.status_code == 201, (past, r.text)
        row = await _row(engine, r.json()["id"])
        assert row.run_at == row.created_at, past
        assert r.json()["run_at"] == r.json()["created_at"]


async def test_run_at_in_the_future_is_stored_as_that_instant_in_utc(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    cases = {
        "2100-01-01T01:00:00.123456+01:00": "2100-01-01T00:00:00.123456Z",
        "2100-01-01T00:00:00.1234567891Z": "2100-01-01T00:00:00.123456Z",  # microseconds
        "2099-12-31t18:30:00.5-05:30": "2100-01-01T00:00:00.500000Z",
        "2100-06-30T23:59:60z": "2100-07-01T00:00:00.000000Z",  # a leap second
        "9999-12-31T23:59:59Z": "9999-12-31T23:59:59.000000Z",
        "9999-12-31T23:59:60+00:01": "9999-12-31T23:59:00.000000Z",
    }
    for sent, expected in cases.items():
        r = await api.post("/jobs", json={"type": "sleep", "run_at": sent})
        assert r.status_code == 201, (sent, r.text)
        assert r.json()["run_at"] == expected, sent
        assert (await _row(engine, r.json()["id"])).run_at == _utc(expected)


@pytest.mark.parametrize(
    ("delay", "seconds"),
    [(0, 0.0), ("0s", 0.0), (90, 90.0), ("1m30s", 90.0), ("1.5", 1.5), ("8784h", 31_622_400.0)],
)
async def test_delay_makes_run_at_the_databases_now_plus_the_delay(
    api: httpx.AsyncClient, engine: AsyncEngine, delay: object, seconds: float
):
    r = await api.post("/jobs", json={"type": "sleep", "delay": delay})
    assert r.status_code == 201, r.text
    row = await _row(engine, r.json()["id"])
    assert row.run_at - row.created_at == timedelta(seconds=seconds)
    assert _utc(r.json()["run_at"]) == row.run_at


# --- idempotency -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "again"),
    [
        ({"delay": "1h"}, {"delay": "2h"}),
        ({"delay": 60}, {}),
        ({"run_at": "2100-01-01T00:00:00Z"}, {"run_at": "2100-01-02T00:00:00Z"}),
        ({"run_at": "2100-01-01T00:00:00Z"}, {"delay": 5}),
        ({"timeout": "30s"}, {"timeout": 30}),
        ({"queue": "default", "priority": 0}, {}),
    ],
)
async def test_same_key_with_another_due_time_is_a_replay_of_the_first_job(
    api: httpx.AsyncClient, engine: AsyncEngine, first: dict[str, Any], again: dict[str, Any]
):
    key = {"Idempotency-Key": "when-not-compared"}
    created = await api.post("/jobs", json={"type": "sleep", **first}, headers=key)
    replay = await api.post("/jobs", json={"type": "sleep", **again}, headers=key)
    assert (created.status_code, replay.status_code) == (201, 200), replay.text
    assert replay.json() == created.json()  # run_at unchanged too
    assert await job_count(engine) == 1


@pytest.mark.parametrize(
    ("first", "again"),
    [
        ({"queue": "a"}, {"queue": "b"}),
        ({"queue": "a"}, {}),
        ({"priority": 1}, {"priority": 2}),
        ({"priority": 1}, {}),
        ({"timeout": "30s"}, {"timeout": "31s"}),
        ({"timeout": "30s"}, {}),
        ({}, {"timeout": 30}),
    ],
)
async def test_same_key_with_another_queue_priority_or_timeout_is_409(
    api: httpx.AsyncClient, engine: AsyncEngine, first: dict[str, Any], again: dict[str, Any]
):
    key = {"Idempotency-Key": "routing-compared"}
    created = await api.post("/jobs", json={"type": "sleep", **first}, headers=key)
    conflict = await api.post("/jobs", json={"type": "sleep", **again}, headers=key)
    assert (created.status_code, conflict.status_code) == (201, 409), conflict.text
    assert await job_count(engine) == 1


# --- batch -------------------------------------------------------------------------


async def test_batch_items_carry_their_own_scheduling_fields(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    items = [
        {"type": "sleep", "queue": "mail", "priority": 5, "timeout": "2m"},
        {"type": "sleep", "delay": "1h"},
        {"type": "sleep", "run_at": "2001-01-01T00:00:00Z"},
        {"type": "sleep", "run_at": "2100-01-01T01:00:00+01:00", "priority": -100},
        {"type": "sleep"},
    ]
    r = await api.post("/jobs/batch", json={"jobs": items})
    assert r.status_code == 200, r.text
    rows = [await _row(engine, result["id"]) for result in r.json()["results"]]
    assert [(row.queue, row.priority, row.timeout) for row in rows] == [
        ("mail", 5, 120.0),
        ("default", 0, None),
        ("default", 0, None),
        ("default", -100, None),
        ("default", 0, None),
    ]
    assert rows[1].run_at - rows[1].created_at == timedelta(hours=1)
    assert rows[2].run_at == rows[2].created_at
    assert rows[3].run_at == _utc("2100-01-01T00:00:00Z")
    assert rows[4].run_at == rows[4].created_at


async def test_batch_names_each_invalid_item_and_field_and_writes_nothing(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    items = [
        {"type": "sleep", "queue": "ok"},
        {"type": "sleep", "queue": "Not-OK"},
        {"type": "sleep", "priority": 1.0},
        {"type": "sleep", "run_at": "2030-01-01T00:00:00"},
        {"type": "sleep", "delay": "367h" * 30},
        {"type": "sleep", "timeout": "0.5s"},
        {"type": "sleep", "run_at": "2030-01-01T00:00:00Z", "delay": 1},
    ]
    r = await api.post("/jobs/batch", json={"jobs": items})
    assert r.status_code == 400
    error = r.json()["error"]
    for shown in (
        "[1] field 'queue'",
        "[2] field 'priority'",
        "[3] field 'run_at'",
        "[4] field 'delay'",
        "[5] field 'timeout'",
        "[6] give either field 'run_at' or field 'delay'",
    ):
        assert shown in error, (shown, error)
    assert "[0]" not in error
    assert await job_count(engine) == 0


async def test_batch_replays_ignore_the_due_time_and_compare_the_routing(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    first = await api.post(
        "/jobs",
        json={"type": "sleep", "queue": "q", "priority": 3, "timeout": 10, "delay": 60},
        headers={"Idempotency-Key": "k"},
    )
    r = await api.post(
        "/jobs/batch",
        json={
            "jobs": [
                {"type": "sleep", "queue": "q", "priority": 3, "timeout": "10s",
                 "run_at": "2100-01-01T00:00:00Z", "idempotency_key": "k"},
                {"type": "sleep", "queue": "q", "priority": 4, "timeout": 10,
                 "idempotency_key": "k"},
                {"type": "sleep", "queue": "q", "priority": 3, "idempotency_key": "k"},
                {"type": "sleep", "queue": "r", "priority": 3, "timeout": 10,
                 "idempotency_key": "k"},
            ]
        },
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert [result["status"] for result in r.json()["results"]] == [
        "replayed",
        "conflict",
        "conflict",
        "conflict",
    ]
    assert r.json()["results"][0]["id"] == first.json()["id"]
    assert await job_count(engine) == 1
