"""Tracing across the real `jobqueue-api` and `jobqueue-worker` (docs/operations.md#tracing):
spans exported over OTLP/HTTP to a receiver in the test; the attempt's span links to the span
of the request that submitted the job. Off, nothing of OpenTelemetry is imported; asked for
without the `otel` extra, each service exits 2 naming the variable."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.procs import Service, free_port, wait_for
from tests.worker.support import ROOT, start_worker

pytestmark = pytest.mark.e2e

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER = f"00-{CALLER_TRACE}-b7ad6b7169203331-01"


class Receiver:
    """An OTLP/HTTP trace receiver on loopback: every span it was sent, with its service."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []
        received = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                for resource_spans in request.resource_spans:
                    service = next(
                        a.value.string_value
                        for a in resource_spans.resource.attributes
                        if a.key == "service.name"
                    )
                    for scope_spans in resource_spans.scope_spans:
                        received.extend((service, span) for span in scope_spans.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def named(self, name: str) -> list[tuple[str, Any]]:
        return [(service, span) for service, span in self.spans if span.name == name]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.server.shutdown()


def _env(receiver_url: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver_url,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms between exports
        "JOB_HANDLERS": "tests.worker.handlers",
        "PYTHONPATH": str(ROOT),
    }


def test_an_attempt_span_links_to_the_request_that_submitted_the_job(
    start_api, database_url, tmp_path, receiver
):
    api = start_api(**_env(receiver.url))
    worker = start_worker(database_url, tmp_path, **_env(receiver.url))
    try:
        created = api.post(
            "/jobs", json={"type": "test.record", "payload": {}}, headers={"traceparent": CALLER}
        )
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        failing = api.post("/jobs", json={"type": "test.permanent", "payload": {}}).json()["id"]

        def attempts() -> list[tuple[str, Any]]:
            return receiver.named("attempt test.record") and receiver.named(
                "attempt test.permanent"
            )

        wait_for(attempts, 60, "the attempts' spans")
        ((api_service, request),) = receiver.named("POST /jobs")[:1]
        submits = {
            next(a.value.string_value for a in span.attributes if a.key == "jobqueue.job.id"): span
            for _, span in receiver.named("submit")
        }
        ((worker_service, attempt),) = receiver.named("attempt test.record")
        ((_, failed),) = receiver.named("attempt test.permanent")
    finally:
        assert worker.stop(60) == 0
        api.service.stop()

    assert api_service == "jobqueue-api" and worker_service == "jobqueue-worker"
    assert request.trace_id.hex() == CALLER_TRACE  # the caller's trace, continued
    submit = submits[job_id]
    assert submit.parent_span_id == request.span_id
    # The attempt is a trace of its own, linked to the submit.
    assert attempt.trace_id != submit.trace_id and not attempt.parent_span_id
    ((link),) = attempt.links
    assert (link.trace_id, link.span_id) == (submit.trace_id, submit.span_id)
    attributes = {a.key: a.value for a in attempt.attributes}
    assert attributes["jobqueue.job.id"].string_value == job_id
    assert attributes["jobqueue.outcome"].string_value == "completed"
    assert attributes["jobqueue.attempt"].int_value == 1
    failed_attributes = {a.key: a.value for a in failed.attributes}
    assert failed_attributes["jobqueue.job.id"].string_value == failing
    assert failed_attributes["jobqueue.outcome"].string_value == "failed"
    assert failed.status.code == failed.status.STATUS_CODE_ERROR
    (failed_link,) = failed.links
    assert failed_link.span_id == submits[failing].span_id


def _without_opentelemetry(tmp_path: Path) -> str:
    """A PYTHONPATH whose sitecustomize makes every `opentelemetry` import fail."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Absent:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'opentelemetry' or name.startswith('opentelemetry.'):\n"
        "            raise ImportError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _Absent())\n"
    )
    return f"{tmp_path}:{ROOT}"


def test_with_tracing_off_the_services_run_without_opentelemetry(start_api, database_url, tmp_path):
    path = _without_opentelemetry(tmp_path)
    api = start_api(JOB_HANDLERS="tests.worker.handlers", PYTHONPATH=path)
    worker = start_worker(database_url, tmp_path, PYTHONPATH=path)
    try:
        job_id = api.post("/jobs", json={"type": "test.record", "payload": {}}).json()["id"]

        def completed() -> bool:
            return api.get(f"/jobs/{job_id}").json()["status"] == "completed"

        wait_for(completed, 60, "the job to complete")
    finally:
        assert worker.stop(60) == 0
        api.service.stop()


@pytest.mark.parametrize("command", ["jobqueue-api", "jobqueue-worker"])
def test_tracing_asked_for_without_the_extra_exits_2_naming_the_variable(
    command, database_url, tmp_path
):
    service = Service(
        command,
        {
            "DATABASE_URL": database_url,
            "HTTP_ADDR": f"127.0.0.1:{free_port()}",
            "METRICS_ADDR": f"127.0.0.1:{free_port()}",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
            "PYTHONPATH": _without_opentelemetry(tmp_path),
        },
    )
    assert service.wait(60) == 2
    (line,) = [entry for entry in service.logs() if entry["level"] == "error"]
    assert line["variable"] == "OTEL_EXPORTER_OTLP_ENDPOINT"
    assert "pip install 'jobqueue[otel]'" in line["msg"]
