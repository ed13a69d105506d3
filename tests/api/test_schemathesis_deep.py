"""Schemathesis against a real `jobqueue-api` process, from the OpenAPI document it serves.

Every operation gets schema-valid and schema-violating requests; schemathesis's
checks (no 5xx, status codes, content types, response schemas and headers,
valid data accepted, invalid data rejected, auth enforced) run on every answer,
and the job count tells whether anything was written: one row for a 201 from
`POST /jobs`, none for anything else.

The quick variant in `make test` is `test_openapi.py`; these runs start when
`FUZZ_EXAMPLES` (examples per operation) is set, as `make fuzz-deep` does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import jsonschema
import psycopg
import pytest
import referencing
import requests
import schemathesis
from hypothesis import HealthCheck, settings

from jobcore.durations import format_duration, parse_duration
from jobcore.registry import registered_types
from jobcore.schema import MAX_TIMEOUT, MIN_TIMEOUT
from jobqueue_api import openapi
from jobqueue_api.validation import DURATION_PATTERN, MAX_DELAY, MAX_WAIT, MIN_DELAY
from tests import pg
from tests.procs import Service, free_port, wait_for

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES") or 0)


def deep(test: Any) -> Any:
    """A run against live processes, only when a budget is given."""
    skip = pytest.mark.skipif(not EXAMPLES, reason="set FUZZ_EXAMPLES (make fuzz-deep) to run")
    return pytest.mark.e2e(skip(test))


TOKEN = "fuzz-token"
MAX_ATTEMPTS = 5


@dataclass
class LiveApi:
    url: str
    db: psycopg.Connection[Any]
    service: Service
    # One keep-alive session for every case: a connection per case would leave the server
    # a socket in CLOSE_WAIT per case for its 5 s idle timeout, counted toward
    # MAX_CONNECTIONS, and a fast run is then refused with 503s.
    session: requests.Session

    def job_count(self) -> int:
        row = self.db.execute("SELECT count(*) FROM jobqueue.jobs").fetchone()
        assert row is not None
        return int(row[0])


def document(auth: bool) -> dict[str, Any]:
    """The document a process with this configuration serves (checked against the live one)."""
    return openapi.document(registered_types(), auth=auth, default_max_attempts=MAX_ATTEMPTS)


def start_api(pg_server: str, pg_template: str, env: dict[str, str]) -> Iterator[LiveApi]:
    name = pg.create_database(pg_server, pg_template)
    database_url = pg.with_database(pg_server, name)
    port = free_port()
    service = Service(
        "jobqueue-api",
        {
            "DATABASE_URL": database_url,
            "HTTP_ADDR": f"127.0.0.1:{port}",
            "MAX_ATTEMPTS": str(MAX_ATTEMPTS),
            "LOG_LEVEL": "warning",
            **env,
        },
    )
    db = psycopg.connect(database_url, autocommit=True)
    api = LiveApi(f"http://127.0.0.1:{port}", db, service, requests.Session())

    def ready() -> bool:
        if service.proc.poll() is not None:
            raise AssertionError(f"jobqueue-api exited:\n{service.output()}")
        try:
            return httpx.get(api.url + "/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(ready, 60, "jobqueue-api to be ready")
        yield api
    finally:
        api.session.close()
        code = service.stop()
        db.close()
        pg.drop_database(pg_server, name)
    assert code == 0, service.output()[-3000:]


@pytest.fixture(scope="module")
def open_api(pg_server: str, pg_template: str) -> Iterator[LiveApi]:
    yield from start_api(pg_server, pg_template, {})


@pytest.fixture(scope="module")
def locked_api(pg_server: str, pg_template: str) -> Iterator[LiveApi]:
    yield from start_api(pg_server, pg_template, {"API_TOKENS": f"other,{TOKEN}"})


@deep
def test_the_fuzzed_documents_are_the_ones_the_processes_serve(
    open_api: LiveApi, locked_api: LiveApi
) -> None:
    assert httpx.get(open_api.url + "/openapi.json").json() == document(auth=False)
    assert httpx.get(locked_api.url + "/openapi.json").json() == document(auth=True)


def test_payload_schema_rejects_what_the_api_rejects() -> None:
    # Regression: the payload schema once admitted any JSON, so "valid" requests with
    # U+0000 in a string or key were refused with 400.
    doc = document(auth=False)
    registry = referencing.Registry().with_resource(
        "urn:doc", referencing.Resource.from_contents(doc, referencing.jsonschema.DRAFT202012)
    )
    create = jsonschema.Draft202012Validator(
        {"$ref": "urn:doc#/components/schemas/CreateJob"}, registry=registry
    )
    for payload in ("a\x00", {"k\x00": 1}, [1, {"a": ["\x00"]}]):
        assert not create.is_valid({"type": "sleep", "payload": payload}), payload
    for payload in ({}, None, [1, 2.5, "é\u2028", {"a": {"b": [True]}}], "\U0001f600"):
        assert create.is_valid({"type": "sleep", "payload": payload}), payload


LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
DURATIONS = {"delay": (MIN_DELAY, MAX_DELAY), "timeout": (MIN_TIMEOUT, MAX_TIMEOUT)}


def _within_unstated_limits(body: Any) -> Any:
    """A generated request with what no JSON Schema can state brought within the API's rules
    (the document's descriptions state them): integer fields as integer literals (JSON
    Schema counts 95.0 as an integer; the API wants 95), a duration string's range, and
    run_at at most 9999-12-31T23:59:59Z once in UTC."""
    if isinstance(body, dict) and isinstance(body.get("jobs"), list):
        return {**body, "jobs": [_within_unstated_limits(item) for item in body["jobs"]]}
    if not isinstance(body, dict):
        return body
    fixed = dict(body)
    for name in ("max_attempts", "priority"):
        value = fixed.get(name)
        if isinstance(value, float) and value.is_integer():
            fixed[name] = int(value)
    for name, (low, high) in DURATIONS.items():
        value = fixed.get(name)
        if isinstance(value, str) and re.fullmatch(DURATION_PATTERN, value):
            try:
                seconds = parse_duration(value)
            except ValueError:  # beyond float range
                seconds = high * 2
            if not low <= seconds <= high:
                fixed[name] = format_duration(min(max(seconds, low), high))
    run_at = fixed.get("run_at")
    if isinstance(run_at, str):
        try:
            late = datetime.fromisoformat(run_at).astimezone(UTC) > LATEST
        except OverflowError:
            late = run_at.startswith("9999")
        except ValueError:  # not a date-time at all: leave it to the API to refuse
            late = False
        if late:
            fixed["run_at"] = "9999-12-31T23:59:59Z"
    return fixed


FUZZ = settings(
    max_examples=max(EXAMPLES, 1),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _wait_within_its_range(query: Any) -> Any:
    """The `wait` query parameter brought within (0, 60 s], which its pattern cannot state
    (the document's description does)."""
    if not isinstance(query, dict) or not isinstance(query.get("wait"), str):
        return query
    value = query["wait"]
    if not re.fullmatch(DURATION_PATTERN, value):
        return query
    try:
        seconds = parse_duration(value)
    except ValueError:  # beyond float range
        seconds = MAX_WAIT
    if 0 < seconds <= MAX_WAIT:
        return query
    return {**query, "wait": format_duration(min(max(seconds, 0.001), MAX_WAIT))}


def with_token(headers: dict[str, str] | None, token: str) -> dict[str, str]:
    """The generated headers with `token` as the credential where the case carries a
    well-formed one (`Bearer <anything>`, the document's scheme): schemathesis cannot know a
    token the API accepts. A case that removed or altered the header is sent as generated,
    so the negative cases about authentication reach the API and must get 401."""
    out = dict(headers or {})
    for name, value in out.items():
        if name.lower() == "authorization" and value.startswith("Bearer "):
            out[name] = f"Bearer {token}"
    return out


# How a request's body is framed is HTTP's, answered by the server before the API sees the
# request (Hypercorn answers 501 to a transfer coding it does not know, as HTTP/1.1 asks),
# not the document's: generated values of these headers are left out.
FRAMING = {"transfer-encoding", "content-length"}


def without_framing(headers: dict[str, str] | None) -> dict[str, str] | None:
    if headers is None:
        return None
    return {name: value for name, value in headers.items() if name.lower() not in FRAMING}


def call_and_check(case: schemathesis.Case, api: LiveApi, token: str | None = None) -> None:
    # Here rather than as a map_body hook: hooks do not reach the coverage phase's cases.
    case.body = _within_unstated_limits(case.body)
    case.query = _wait_within_its_range(case.query)
    case.headers = without_framing(case.headers)
    if token is not None:
        case.headers = with_token(case.headers, token)
    before = api.job_count()
    response = case.call_and_validate(base_url=api.url, session=api.session, timeout=30)
    written = api.job_count() - before
    expected = 0
    if case.method.upper() == "POST" and case.path == "/jobs" and response.status_code == 201:
        expected = 1
    if case.method.upper() == "POST" and case.path == "/jobs/batch" and response.status_code == 200:
        expected = sum(r["status"] == "created" for r in response.json()["results"])
    assert written == expected, (response.status_code, written, expected)


open_schema = schemathesis.openapi.from_dict(document(auth=False))
locked_schema = schemathesis.openapi.from_dict(document(auth=True))


@open_schema.parametrize()
@deep
@FUZZ
def test_open_api_conforms_to_its_document_and_writes_only_on_201(
    case: schemathesis.Case, open_api: LiveApi
) -> None:
    call_and_check(case, open_api)


@locked_schema.parametrize()
@deep
@FUZZ
def test_api_with_tokens_conforms_to_its_document_and_writes_only_on_201(
    case: schemathesis.Case, locked_api: LiveApi
) -> None:
    call_and_check(case, locked_api, TOKEN)


def test_the_token_replaces_only_a_well_formed_generated_credential() -> None:
    assert with_token({"Authorization": "Bearer x7"}, TOKEN) == {
        "Authorization": "Bearer fuzz-token"
    }
    assert with_token({"authorization": "Bearer "}, TOKEN) == {"authorization": "Bearer fuzz-token"}
    assert with_token({"0": ";"}, TOKEN) == {"0": ";"}  # removed: sent without one
    assert with_token(None, TOKEN) == {}
    assert with_token({"Authorization": "priority"}, TOKEN) == {"Authorization": "priority"}
    assert with_token({"Authorization": "bearer x"}, TOKEN) == {"Authorization": "bearer x"}


def test_generated_framing_headers_are_left_to_the_http_client() -> None:
    headers = {"Transfer-Encoding": "-\tX", "content-length": "7", "X-Other": "kept"}
    assert without_framing(headers) == {"X-Other": "kept"}
    assert without_framing(None) is None
