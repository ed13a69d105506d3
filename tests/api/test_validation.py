"""Bad input is a clear 400 and writes nothing; odd but valid input is accepted."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue_api import validation
from tests.api.conftest import job_count

BAD_BODIES = {
    "malformed JSON": (b'{"type": "sleep",', "not valid JSON"),
    "empty body": (b"", "empty"),
    "NaN is not JSON": (b'{"type": "sleep", "payload": NaN}', "NaN"),
    "number beyond float range": (b'{"type": "sleep", "payload": 1e400}', "out of range"),
    "invalid UTF-8": (b'{"type": "sleep", "payload": "\xff"}', "UTF-8"),
    "array body": (b'[{"type": "sleep"}]', "JSON object"),
    "string body": (b'"sleep"', "JSON object"),
    "null body": (b"null", "JSON object"),
    "missing type": (b'{"payload": {}}', "'type' is required"),
    "null type": (b'{"type": null}', "'type' must be a string"),
    "numeric type": (b'{"type": 1}', "'type' must be a string"),
    "unknown type": (b'{"type": "no-such-type"}', "unknown job type"),
    "empty type": (b'{"type": ""}', "unknown job type"),
    "max_attempts 0": (b'{"type": "sleep", "max_attempts": 0}', "max_attempts"),
    "max_attempts 101": (b'{"type": "sleep", "max_attempts": 101}', "max_attempts"),
    "max_attempts negative": (b'{"type": "sleep", "max_attempts": -1}', "max_attempts"),
    "max_attempts true": (b'{"type": "sleep", "max_attempts": true}', "max_attempts"),
    "max_attempts false": (b'{"type": "sleep", "max_attempts": false}', "max_attempts"),
    "max_attempts 3.0": (b'{"type": "sleep", "max_attempts": 3.0}', "max_attempts"),
    "max_attempts string": (b'{"type": "sleep", "max_attempts": "3"}', "max_attempts"),
    "max_attempts null": (b'{"type": "sleep", "max_attempts": null}', "max_attempts"),
    "max_attempts huge": (
        b'{"type": "sleep", "max_attempts": 1' + b"0" * 30 + b"}",
        "max_attempts",
    ),
    "unknown field": (b'{"type": "sleep", "colour": 1}', "unknown field(s): 'colour'"),
    "NUL in payload string": (b'{"type": "sleep", "payload": "a\\u0000b"}', "\\u0000"),
    "NUL deep in payload": (
        b'{"type": "sleep", "payload": {"a": [1, {"b": "\\u0000"}]}}',
        "\\u0000",
    ),
    "NUL in a payload key": (b'{"type": "sleep", "payload": {"k\\u0000": 1}}', "\\u0000"),
    "NUL in a top-level key": (b'{"type": "sleep", "\\u0000": 1}', "\\u0000"),
    "NUL in type": (b'{"type": "sleep\\u0000"}', "\\u0000"),
    "lone surrogate": (b'{"type": "sleep", "payload": "\\ud800"}', "surrogate"),
    "too deeply nested": (
        b'{"type": "sleep", "payload": ' + b"[" * 150 + b"]" * 150 + b"}",
        "nested deeper",
    ),
    "nested beyond the parser": (
        b'{"type": "sleep", "payload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "nested deeper",
    ),
}


async def test_bad_body_is_400_with_a_message_and_writes_nothing(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    # One database for every case (creating one per case would dominate the run time);
    # every failing case is reported, not just the first.
    failures = []
    for case, (body, expected) in BAD_BODIES.items():
        r = await api.post("/jobs", content=body, headers={"Content-Type": "application/json"})
        ok = (
            r.status_code == 400
            and r.headers["content-type"] == "application/json"
            and set(r.json()) == {"error"}
            and expected in r.json()["error"]
        )
        if not ok:
            failures.append(f"{case}: {r.status_code} {r.text[:200]}")
    assert failures == []
    assert await job_count(engine) == 0


BAD_KEYS = {
    "empty": b"",
    "too long": b"k" * 256,
    "control character": b"a\x01b",
    "DEL": b"a\x7fb",
    "non-ASCII": "clé".encode(),
    "tab inside": b"a\tb",
}


async def test_bad_idempotency_key_is_400_and_writes_nothing(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    failures = []
    for case, key in BAD_KEYS.items():
        r = await api.post("/jobs", json={"type": "sleep"}, headers=[(b"Idempotency-Key", key)])
        if r.status_code != 400 or "Idempotency-Key" not in r.json()["error"]:
            failures.append(f"{case}: {r.status_code} {r.text[:200]}")
    assert failures == []
    assert await job_count(engine) == 0


async def test_repeated_idempotency_key_header_is_400(api: httpx.AsyncClient, engine: AsyncEngine):
    headers = [(b"Idempotency-Key", b"a"), (b"Idempotency-Key", b"b")]
    r = await api.post("/jobs", json={"type": "sleep"}, headers=headers)
    assert r.status_code == 400 and "at most once" in r.json()["error"]
    assert await job_count(engine) == 0


async def test_keys_of_1_to_255_printable_characters_are_accepted(api: httpx.AsyncClient):
    for key in ["k", "k" * 255, "order 42/!~", "~"]:
        r = await api.post("/jobs", json={"type": "sleep"}, headers={"Idempotency-Key": key})
        assert r.status_code == 201, (key, r.text)


async def test_json_sent_with_a_form_content_type_is_accepted(api: httpx.AsyncClient):
    # What `curl -d '{...}'` sends.
    r = await api.post(
        "/jobs",
        content=b'{"type":"sleep","payload":{"duration":"2s"}}',
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 201
    assert r.json()["payload"] == {"duration": "2s"}


async def test_escaped_backslash_u0000_text_is_not_nul_and_is_accepted(api: httpx.AsyncClient):
    r = await api.post("/jobs", content=b'{"type":"sleep","payload":"\\\\u0000"}')
    assert r.status_code == 201
    assert r.json()["payload"] == "\\u0000"


async def test_surrogate_pair_and_nesting_at_the_limit_are_accepted(api: httpx.AsyncClient):
    nested: object = "\ud83d\ude00"
    for _ in range(validation.MAX_DEPTH - 1):
        nested = [nested]
    r = await api.post("/jobs", content=json.dumps({"type": "sleep", "payload": nested}))
    assert r.status_code == 201, r.text


def test_new_job_validates_one_item_without_a_request():
    job = validation.new_job(
        {"type": "sleep", "payload": [1]}, known_types=["sleep"], default_max_attempts=3
    )
    assert (job.type, job.payload, job.max_attempts, job.idempotency_key) == ("sleep", [1], 3, None)
    with pytest.raises(validation.InvalidRequest, match="unknown field"):
        validation.new_job(
            {"type": "sleep", "idempotency_key": "k"}, known_types=["sleep"], default_max_attempts=3
        )
    keyed = validation.new_job(
        {"type": "sleep"},
        known_types=["sleep"],
        default_max_attempts=3,
        idempotency_key=validation.check_key("k", "idempotency_key"),
    )
    assert keyed.idempotency_key == "k"


async def test_a_periodic_schedules_key_cannot_be_taken_by_a_client(
    api: httpx.AsyncClient, engine: AsyncEngine
):
    """Else a client could submit `periodic:<name>:<tick>` ahead of the tick and skip it
    (another payload) or postpone it (the same one with a delay)."""
    key = "periodic:report-5m:2099-01-01T10:10:00Z"
    single = await api.post("/jobs", json={"type": "sleep"}, headers={"Idempotency-Key": key})
    batch = await api.post(
        "/jobs/batch", json={"jobs": [{"type": "sleep", "idempotency_key": key, "delay": 9e6}]}
    )
    for answer in (single, batch):
        assert answer.status_code == 400, answer.text
        assert "reserved" in answer.json()["error"] and "periodic:" in answer.json()["error"]
    assert await job_count(engine) == 0
    # Only the prefix is reserved.
    near = await api.post("/jobs", json={"type": "sleep"}, headers={"Idempotency-Key": "periodic"})
    assert near.status_code == 201
