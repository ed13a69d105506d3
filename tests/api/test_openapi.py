"""/openapi.json describes the API, and the real server never contradicts it under fuzzing."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.strategies import SearchStrategy
from schemathesis import Case, GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from jobqueue_api.openapi import document
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
    for path in ("/jobs", "/jobs/{id}", "/jobs/{id}/status", "/jobs/{id}/retry"):
        (operation,) = doc["paths"][path].values()
        assert operation["security"] == [{"bearer": []}]
        assert "401" in operation["responses"]
    assert "security" not in doc["paths"]["/healthz"]["get"]


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
        "POST /jobs/batch",
        "GET /jobs/{id}",
        "GET /jobs/{id}/status",
        "POST /jobs/{id}/retry",
    }
    assert jobs <= labels
    for operation in operations:
        # Only the create endpoints constrain their input, so only they have invalid
        # requests to make.
        constrained = operation.label in ("POST /jobs", "POST /jobs/batch")
        modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if constrained else [])
        for mode in modes:
            _fuzz(operation.as_strategy(mode), constrained)


def _fuzz(cases: SearchStrategy[Case], constrained: bool) -> None:
    # The create endpoints are deliberately stricter than JSON Schema can say (3.0 is an
    # "integer" there but not to us), so schema-valid input may rightly get a 400.
    excluded = [positive_data_acceptance] if constrained else []

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
