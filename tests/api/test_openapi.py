"""/openapi.json describes the API, and the real server never contradicts it under fuzzing."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import jsonschema
import pytest
import referencing
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.strategies import SearchStrategy
from schemathesis import Case, GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from jobcore.schema import (
    MAX_KEY_LENGTH,
    MAX_PRIORITY,
    MAX_TIMEOUT,
    MIN_PRIORITY,
    MIN_TIMEOUT,
    QUEUE_PATTERN,
)
from jobqueue_api.openapi import document
from jobqueue_api.validation import CONCURRENCY_KEY_PATTERN, DURATION_PATTERN
from tests.procs import Service, free_port, wait_for


def test_document_lists_every_endpoint_and_the_registered_types():
    doc = document(["sleep", "webhook"], auth=False, default_max_attempts=5)
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) == {
        "/jobs",
        "/jobs/batch",
        "/jobs/{id}",
        "/jobs/{id}/status",
        "/jobs/{id}/retry",
        "/jobs/{id}/cancel",
        "/jobs/cancel",
        "/jobs/retry",
        "/queues",
        "/queues/{queue}/pause",
        "/queues/{queue}/resume",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
    }
    create = doc["components"]["schemas"]["CreateJob"]
    assert create["properties"]["type"]["enum"] == ["sleep", "webhook"]
    assert create["additionalProperties"] is False
    assert "securitySchemes" not in doc["components"]
    assert set(doc["paths"]["/jobs"]["post"]["responses"]) == {
        "200", "201", "400", "409", "413", "503",
    }  # fmt: skip


def test_document_declares_bearer_auth_when_tokens_are_set():
    doc = document(["sleep"], auth=True, default_max_attempts=5)
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    locked = [
        (path, method)
        for path, operations in doc["paths"].items()
        if path == "/jobs" or path.startswith(("/jobs/", "/queues"))
        for method in operations
    ]
    assert len(locked) == 12
    for path, method in locked:
        operation = doc["paths"][path][method]
        assert operation["security"] == [{"bearer": []}], (path, method)
        assert "401" in operation["responses"]
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert "security" not in doc["paths"][path]["get"]


@pytest.fixture
def server(database_url: str) -> Iterator[str]:
    port = free_port()
    service = Service(
        "jobqueue-api", {"DATABASE_URL": database_url, "HTTP_ADDR": f"127.0.0.1:{port}"}
    )
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert service.proc.poll() is None, service.output()
        try:
            return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(ready, 30, "jobqueue-api to become ready")
        yield base
    finally:
        assert service.stop() == 0, service.output()
        # However the fuzzer pushed, no response was a traceback or a 5xx.
        statuses = [line.get("status") for line in service.logs() if line.get("msg") == "request"]
        assert statuses and all(status < 500 for status in statuses)


# Small on purpose: a quick test on a shared machine. Raise it locally to hunt harder.
EXAMPLES_PER_OPERATION_AND_MODE = 10


@pytest.mark.e2e
def test_fuzzed_requests_never_get_a_5xx_or_a_response_the_document_does_not_allow(server: str):
    schema = schemathesis.openapi.from_url(f"{server}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    labels = {operation.label for operation in operations}
    jobs = {
        "POST /jobs",
        "GET /jobs",
        "POST /jobs/batch",
        "GET /jobs/{id}",
        "GET /jobs/{id}/status",
        "POST /jobs/{id}/retry",
        "POST /jobs/{id}/cancel",
        "GET /queues",
    }
    assert jobs <= labels
    for operation in operations:
        # Only these constrain their input (body or query), so only they have invalid
        # requests to make.
        constrained = operation.label in CONSTRAINED
        modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if constrained else [])
        for mode in modes:
            _fuzz(operation.as_strategy(mode), operation.label in STRICTER)


CONSTRAINED = ("POST /jobs", "POST /jobs/batch", "GET /jobs", "GET /jobs/{id}")
# Stricter than JSON Schema can say: 3.0 is an "integer" there but not to the create
# endpoints, and no pattern states a duration's range (`wait`, `delay`, `timeout`). So
# schema-valid input may rightly get a 400 here.
STRICTER = ("POST /jobs", "POST /jobs/batch", "GET /jobs/{id}")


def _fuzz(cases: SearchStrategy[Case], stricter: bool) -> None:
    excluded = [positive_data_acceptance] if stricter else []

    @given(case=cases)
    @settings(
        max_examples=EXAMPLES_PER_OPERATION_AND_MODE,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],
    )
    def fuzz(case: Case) -> None:
        case.call_and_validate(excluded_checks=excluded)

    fuzz()


def _validator(schema: str) -> jsonschema.Draft202012Validator:
    doc = document(["sleep", "webhook"], auth=False, default_max_attempts=5)
    registry = referencing.Registry().with_resource(
        "urn:doc", referencing.Resource.from_contents(doc, referencing.jsonschema.DRAFT202012)
    )
    return jsonschema.Draft202012Validator(
        {"$ref": f"urn:doc#/components/schemas/{schema}"},
        registry=registry,
        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
    )


def test_document_states_the_scheduling_fields_with_jobcores_limits():
    schemas = document(["sleep"], auth=False, default_max_attempts=5)["components"]["schemas"]
    for name in ("CreateJob", "BatchItem"):
        fields = schemas[name]["properties"]
        assert fields["queue"]["pattern"] == QUEUE_PATTERN
        assert fields["queue"]["default"] == "default"
        priority = fields["priority"]
        assert (priority["minimum"], priority["maximum"]) == (MIN_PRIORITY, MAX_PRIORITY)
        assert fields["run_at"]["format"] == "date-time"
        for field, low, high in (("delay", 0, 366 * 86400), ("timeout", MIN_TIMEOUT, MAX_TIMEOUT)):
            number, text = fields[field]["anyOf"]
            assert (number["minimum"], number["maximum"]) == (low, high)
            assert text["pattern"] == DURATION_PATTERN
        assert schemas[name]["not"] == {"required": ["run_at", "delay"]}
        key = fields["concurrency_key"]
        assert (key["type"], key["minLength"], key["maxLength"]) == ("string", 1, MAX_KEY_LENGTH)
        assert key["pattern"] == CONCURRENCY_KEY_PATTERN
    job = schemas["Job"]
    assert {"queue", "priority", "timeout", "concurrency_key"} <= set(job["required"])
    assert job["properties"]["timeout"]["type"] == ["number", "null"]
    for name in ("Job", "JobRecord"):
        key = schemas[name]["properties"]["concurrency_key"]
        assert key["type"] == ["string", "null"]
        assert (key["maxLength"], key["pattern"]) == (MAX_KEY_LENGTH, CONCURRENCY_KEY_PATTERN)


# fields -> whether the API takes them
SCHEDULING_REQUESTS: list[tuple[dict[str, object], bool]] = [
    ({"queue": "mail.eu_1-a"}, True),
    ({"queue": "Mail"}, False),
    ({"queue": "q" * 64}, False),
    ({"priority": 100}, True),
    ({"priority": 101}, False),
    ({"priority": "1"}, False),
    ({"run_at": "2030-01-01T00:00:00Z"}, True),
    ({"run_at": "2030-01-01t00:00:00.5+05:30"}, True),
    ({"run_at": "2030-01-01T00:00:00"}, False),
    ({"run_at": "2030-01-01"}, False),
    ({"run_at": "2030-01-01T12:99:00Z"}, False),  # the document says it with format only
    ({"delay": 0}, True),
    ({"delay": -1}, False),
    ({"delay": 366 * 86400 + 1}, False),
    ({"delay": "1m30s"}, True),
    ({"delay": "8785h"}, False),  # a duration string's range: in the description only
    ({"delay": "5s*"}, False),
    ({"delay": "five"}, False),
    ({"timeout": 1}, True),
    ({"timeout": 0.5}, False),
    ({"timeout": "24h"}, True),
    ({"timeout": "1.5"}, True),
    ({"timeout": None}, False),
    ({"run_at": "2030-01-01T00:00:00Z", "delay": 1}, False),
    ({"concurrency_key": "tenant 7/é"}, True),
    ({"concurrency_key": "k" * 255}, True),
    ({"concurrency_key": "k" * 256}, False),
    ({"concurrency_key": ""}, False),
    ({"concurrency_key": "a\tb"}, False),
    ({"concurrency_key": "a\x9fb"}, False),
    ({"concurrency_key": "a\u2028b"}, False),
    ({"concurrency_key": 7}, False),
    ({"concurrency_key": None}, False),
]


async def test_what_the_api_takes_the_document_admits_and_what_it_refuses_the_api_refuses(
    api: httpx.AsyncClient,
):
    # Schemathesis sends what the document refuses and expects a 4xx, and what it admits
    # expecting a 2xx where no unstated limit applies.
    wrong = []
    for schema in ("CreateJob", "BatchItem"):
        validator = _validator(schema)
        for fields, takes in SCHEDULING_REQUESTS:
            request = {"type": "sleep", **fields}
            if schema == "CreateJob":
                r = await api.post("/jobs", json=request)
                took = r.status_code == 201
            else:
                r = await api.post("/jobs/batch", json={"jobs": [request]})
                took = r.status_code == 200
            admitted = validator.is_valid(request)
            if took != takes or (took and not admitted):
                wrong.append(f"{schema} {fields}: admitted {admitted}, {r.status_code} {r.text}")
    assert wrong == []
