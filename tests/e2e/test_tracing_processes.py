"""Tracing across the real `jobqueue-api` and `jobqueue-worker` (docs/operations.md#tracing):
spans exported over OTLP/HTTP to a receiver in the test; the attempt's span links to the span
of the request that submitted the job. Off, nothing of OpenTelemetry is imported; asked for
without the `otel` extra, each service exits 2 naming the variable."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time
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
from tests.worker.support import ROOT, eventually, fetch, start_worker, submit

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


class SilentCollector:
    """A TCP listener on loopback that accepts every connection and never answers: a
    collector that hangs (each export waits for its whole OTEL_EXPORTER_OTLP_TIMEOUT)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self._stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.held.append(conn)  # read nothing, answer nothing

    def close(self) -> None:
        self._stopped.set()
        for conn in self.held:
            conn.close()
        self.sock.close()


@pytest.fixture
def silent_collector() -> Iterator[SilentCollector]:
    collector = SilentCollector()
    yield collector
    collector.close()


SHUTDOWN_TIMEOUT = 2.0
# Beyond SHUTDOWN_TIMEOUT: the interpreter's own exit, on two busy shared cores.
EXIT_MARGIN = 2.0


def test_a_collector_that_never_answers_does_not_hold_the_apis_exit_past_shutdown_timeout(
    start_api, silent_collector
):
    api = start_api(
        OTEL_EXPORTER_OTLP_ENDPOINT=silent_collector.url,
        OTEL_BSP_SCHEDULE_DELAY="50",  # the first batch goes out (and hangs) at once
        SHUTDOWN_TIMEOUT=f"{SHUTDOWN_TIMEOUT:g}s",
    )
    for _ in range(2):
        assert api.post("/jobs", json={"type": "sleep", "payload": {}}).status_code == 201
    # An export is in flight, hanging, and the second request's spans wait behind it.
    wait_for(lambda: silent_collector.held, 30, "an export to reach the collector")
    began = time.monotonic()
    api.service.signal(signal.SIGTERM)
    try:
        code = api.service.wait(SHUTDOWN_TIMEOUT + 60)
    finally:
        took = time.monotonic() - began
    assert code == 0, api.service.output()
    assert took < SHUTDOWN_TIMEOUT + EXIT_MARGIN, f"exited {took:.1f}s after SIGTERM"
    assert "Traceback" not in api.service.output()


async def test_a_collector_that_never_answers_does_not_hold_the_workers_exit_past_shutdown_timeout(
    database_url, engine, tmp_path, silent_collector
):
    worker = start_worker(
        database_url,
        tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT=silent_collector.url,
        OTEL_BSP_SCHEDULE_DELAY="50",
        SHUTDOWN_TIMEOUT=f"{SHUTDOWN_TIMEOUT:g}s",
    )
    try:
        ids = await submit(engine, "test.record", count=2)

        async def finished() -> bool:
            jobs = await fetch(engine, ids)
            return all(job.status == "completed" for job in jobs.values())

        await eventually(finished, 60, "the jobs to complete")

        async def exporting() -> bool:
            return bool(silent_collector.held)

        await eventually(exporting, 30, "an export to reach the collector")
        began = time.monotonic()
        worker.signal(signal.SIGTERM)
        code = await asyncio.to_thread(worker.wait, SHUTDOWN_TIMEOUT + 60)
        took = time.monotonic() - began
    finally:
        if worker.proc.poll() is None:
            worker.kill()
    assert code == 0, worker.output()
    assert took < SHUTDOWN_TIMEOUT + EXIT_MARGIN, f"exited {took:.1f}s after SIGTERM"
    assert not worker.messages("worker process stalled, killing it"), worker.output()


@pytest.mark.parametrize("command", ["jobqueue-api", "jobqueue-worker"])
@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"OTEL_BSP_SCHEDULE_DELAY": "abc"}, "OTEL_BSP_SCHEDULE_DELAY"),
        ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4096"}, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
    ],
)
def test_an_invalid_otel_variable_exits_2_with_one_line_naming_it(
    command, database_url, env, variable
):
    service = Service(
        command,
        {
            "DATABASE_URL": database_url,
            "HTTP_ADDR": f"127.0.0.1:{free_port()}",
            "METRICS_ADDR": f"127.0.0.1:{free_port()}",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
            # The worker makes a metrics directory of its own; for any other process
            # prometheus_client would take even an empty value as one (the working directory).
            **({"PROMETHEUS_MULTIPROC_DIR": ""} if command == "jobqueue-worker" else {}),
            **env,
        },
    )
    assert service.wait(60) == 2, service.output()
    assert "Traceback" not in service.output()
    (line,) = service.logs()
    assert line["level"] == "error" and line["variable"] == variable
    assert line["msg"].startswith(f"invalid configuration: {variable}: ")
