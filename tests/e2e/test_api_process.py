"""The real `jobqueue-api` process: serving, startup refusals, and graceful shutdown."""

from __future__ import annotations

import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.procs import Service, free_port, wait_for

pytestmark = pytest.mark.e2e

STARTUP = 60  # generous: two shared cores, other suites running


class Api:
    def __init__(self, database_url: str, **env: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.service = Service(
            "jobqueue-api",
            {"DATABASE_URL": database_url, "HTTP_ADDR": f"127.0.0.1:{self.port}", **env},
        )

    def get(self, path: str, **kwargs: object) -> httpx.Response:
        return httpx.get(self.base + path, timeout=10, **kwargs)  # type: ignore[arg-type]

    def post(self, path: str, **kwargs: object) -> httpx.Response:
        return httpx.post(self.base + path, timeout=10, **kwargs)  # type: ignore[arg-type]

    def status_of(self, path: str) -> int | None:
        try:
            return self.get(path).status_code
        except httpx.TransportError:
            return None

    def wait_ready(self) -> None:
        def ready() -> bool:
            assert self.service.proc.poll() is None, self.service.output()
            return self.status_of("/readyz") == 200

        wait_for(ready, STARTUP, "jobqueue-api to become ready")


def test_serves_jobs_logs_json_and_exits_0_on_sigterm(start_api: Callable[..., Api]):
    api = start_api()
    created = api.post(
        "/jobs",
        content=b'{"type":"sleep","payload":{"duration":"2s"}}',
        headers={"Content-Type": "application/x-www-form-urlencoded", "X-Request-ID": "e2e-1"},
    )
    assert created.status_code == 201, created.text
    job = created.json()
    assert api.get(created.headers["location"]).json() == {**job, "errors": []}
    assert api.get(f"/jobs/{job['id']}/status").json()["status"] == "pending"
    assert "jobs_submitted_total 1.0" in api.get("/metrics").text

    assert api.service.stop() == 0
    lines = api.service.logs()  # every stdout line is one JSON object
    messages = [line["msg"] for line in lines]
    assert any("API_TOKENS is not set" in m for m in messages)
    access = [line for line in lines if line["msg"] == "request" and line["request_id"] == "e2e-1"]
    assert len(access) == 1
    assert access[0]["method"] == "POST" and access[0]["status"] == 201
    assert messages[-1] == "stopped"


def test_scheduling_fields_are_taken_and_shown_by_the_real_process(
    start_api: Callable[..., Api],
):
    api = start_api()
    # As `curl -d` sends it: a form Content-Type, JSON inside.
    created = api.post(
        "/jobs",
        content=b'{"type":"sleep","queue":"mail","priority":-5,"timeout":"1m30s",'
        b'"run_at":"2100-01-01T01:00:00+01:00"}',
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert created.status_code == 201, created.text
    job = created.json()
    assert (job["queue"], job["priority"], job["timeout"]) == ("mail", -5, 90.0)
    assert job["run_at"] == "2100-01-01T00:00:00.000000Z"
    assert api.get(f"/jobs/{job['id']}").json() == {**job, "errors": []}
    both = api.post("/jobs", json={"type": "sleep", "run_at": job["run_at"], "delay": "1s"})
    assert both.status_code == 400 and "'delay'" in both.json()["error"]
    batch = api.post("/jobs/batch", json={"jobs": [{"type": "sleep", "queue": "Mail"}]})
    assert batch.status_code == 400 and "[0] field 'queue'" in batch.json()["error"]
    assert api.service.stop() == 0


def test_with_api_tokens_there_is_no_warning_and_a_token_is_required(
    start_api: Callable[..., Api],
):
    api = start_api(API_TOKENS="s3cret")
    assert api.post("/jobs", json={"type": "sleep"}).status_code == 401
    ok = api.post("/jobs", json={"type": "sleep"}, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 201
    assert api.service.stop() == 0
    assert not any("API_TOKENS" in line["msg"] for line in api.service.logs())


def test_refuses_to_start_when_the_schema_is_not_at_head(empty_database_url: str):
    service = Service(
        "jobqueue-api",
        {"DATABASE_URL": empty_database_url, "HTTP_ADDR": f"127.0.0.1:{free_port()}"},
    )
    code = service.wait(STARTUP)
    assert code != 0
    assert "jobqueue migrate" in service.output()
    service.logs()  # still JSON


@pytest.mark.parametrize(
    "variable, value",
    [
        ("MAX_BODY_BYTES", "lots"),
        ("JOB_HANDLERS", "no.such.module"),
    ],
)
def test_invalid_configuration_is_one_line_naming_the_variable_and_exit_2(
    database_url: str, variable: str, value: str
):
    service = Service("jobqueue-api", {"DATABASE_URL": database_url, variable: value})
    assert service.wait(STARTUP) == 2
    (line,) = service.logs()
    assert line["level"] == "error" and variable in line["msg"]
    assert line["variable"] == variable


def test_sigterm_drains_then_closes_the_listener_and_finishes_in_flight_requests(
    start_api: Callable[..., Api],
):
    api = start_api(DRAIN_DELAY="3s")
    body = b'{"type":"sleep","payload":{"in_flight":true}}'
    head = (
        f"POST /jobs HTTP/1.1\r\nHost: api\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", api.port), timeout=30) as conn:
        # A request in flight across the whole shutdown: its body is half sent.
        conn.sendall(head + body[:10])
        signalled = time.monotonic()
        api.service.signal(signal.SIGTERM)

        # During DRAIN_DELAY: not ready, but alive and still serving.
        wait_for(lambda: api.status_of("/readyz") == 503, 10, "/readyz to answer 503")
        assert api.get("/healthz").status_code == 200
        assert api.post("/jobs", json={"type": "sleep"}).status_code == 201

        def listener_closed() -> bool:
            try:
                socket.create_connection(("127.0.0.1", api.port), timeout=1).close()
                return False
            except ConnectionRefusedError:
                return True

        wait_for(listener_closed, 20, "the listener to close")
        assert time.monotonic() - signalled >= 3
        assert api.service.proc.poll() is None  # still finishing our request
        conn.sendall(body[10:])
        response = b""
        while chunk := conn.recv(65536):
            response += chunk
    assert response.startswith(b"HTTP/1.1 201"), response[:200]
    assert api.service.wait(30) == 0
    messages = [line["msg"] for line in api.service.logs()]
    assert "shutdown requested: /readyz now answers 503" in messages


def test_a_second_signal_exits_at_once(start_api: Callable[..., Api]):
    api = start_api(DRAIN_DELAY="60s")
    api.service.signal(signal.SIGTERM)
    wait_for(lambda: api.status_of("/readyz") == 503, 10, "/readyz to answer 503")
    api.service.signal(signal.SIGINT)
    assert api.service.wait(10) == 128 + signal.SIGINT
    assert "second signal: exiting now" in [m["msg"] for m in api.service.logs()]


def test_an_address_in_use_is_one_line_naming_http_addr_and_exit_1(database_url: str):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        service = Service(
            "jobqueue-api", {"DATABASE_URL": database_url, "HTTP_ADDR": f"127.0.0.1:{port}"}
        )
        assert service.wait(STARTUP) == 1
    errors = [line for line in service.logs() if line["level"] == "error"]
    assert len(errors) == 1 and "HTTP_ADDR" in errors[0]["msg"], errors


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("DATABASE_URL", "?foo=bar", "'foo'"),
        ("DATABASE_URL", "?sslmode=required", "sslmode"),
        ("DATABASE_LISTEN_URL", "?sslmode=required", "sslmode"),
        ("REQUEST_BODY_TIMEOUT", "1h", "at most 5m"),
        ("MAX_CONNECTIONS", "none", "MAX_CONNECTIONS"),
        ("SHUTDOWN_TIMEOUT", "1e13", "at most 1h"),
        ("MAX_PENDING", "default:100,bulk:0", "'bulk'"),
    ],
)
def test_unsupported_url_parameters_and_absurd_values_exit_2_with_one_line(
    database_url: str, variable: str, value: str, named: str
):
    if value.startswith("?"):
        value = database_url + value
    service = Service("jobqueue-api", {"DATABASE_URL": database_url, variable: value})
    assert service.wait(STARTUP) == 2
    (line,) = service.logs()
    assert line["level"] == "error" and line["variable"] == variable
    assert named in line["msg"]


def test_max_connections_beyond_the_open_files_limit_is_refused(database_url: str):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard > 100_000:
        pytest.skip("the open-files limit here fits any MAX_CONNECTIONS")
    service = Service("jobqueue-api", {"DATABASE_URL": database_url, "MAX_CONNECTIONS": "100000"})
    assert service.wait(STARTUP) == 2
    (line,) = service.logs()
    assert line["variable"] == "MAX_CONNECTIONS" and "ulimit -n" in line["msg"]


def test_the_default_max_connections_shrinks_to_a_low_open_files_limit_instead_of_failing():
    # In a process of its own: the limit is lowered for good there.
    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (500, 1000))\n"
        "from jobcore.errors import ConfigError\n"
        "from jobqueue_api.main import ensure_fd_limit\n"
        "limit = ensure_fd_limit(2048, explicit=False)\n"
        "print(limit, resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
        "try:\n"
        "    ensure_fd_limit(2048, explicit=True)\n"
        "except ConfigError as exc:\n"
        "    print(exc.variable)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["936", "1000", "MAX_CONNECTIONS"]


def test_a_database_url_with_libpq_parameters_is_served(database_url: str):
    url = (
        f"{database_url}?sslmode=disable&connect_timeout=5&application_name=api-from-url"
        "&options=-c%20lock_timeout%3D5s"
    )
    api = Api(url)
    try:
        api.wait_ready()
        assert api.post("/jobs", json={"type": "sleep"}).status_code == 201
        assert api.service.stop() == 0
    finally:
        if api.service.proc.poll() is None:
            api.service.kill()


def test_sslmode_require_against_a_server_without_tls_is_one_line_and_exit_1(
    database_url: str,
):
    api = Api(f"{database_url}?sslmode=require")
    assert api.service.wait(STARTUP) == 1
    (line,) = [line for line in api.service.logs() if line["level"] == "error"]
    assert "database unreachable at startup" in line["msg"] and "SSL" in line["msg"]
    assert "Traceback" not in api.service.output()


def _rejected(api: Api) -> dict[str, float]:
    return {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(api.get("/metrics").text)
        for s in family.samples
        if s.name == "jobs_rejected_total"
    }


def test_a_full_queue_is_refused_with_429_by_the_real_process_until_it_drains(
    start_api: Callable[..., Api], database_url: str
):
    api = start_api(MAX_PENDING="default:3")
    assert _rejected(api) == {"admission": 0.0, "validation": 0.0}
    first = api.post("/jobs", json={"type": "sleep"}, headers={"Idempotency-Key": "e2e-k"})
    assert first.status_code == 201
    for _ in range(2):
        assert api.post("/jobs", json={"type": "sleep", "delay": "1h"}).status_code == 201

    refused = api.post("/jobs", json={"type": "sleep"})
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert "'default'" in refused.json()["error"]
    batch = {"jobs": [{"type": "sleep", "queue": "mail"}, {"type": "sleep"}]}
    assert api.post("/jobs/batch", json=batch).status_code == 429
    replay = api.post("/jobs", json={"type": "sleep"}, headers={"Idempotency-Key": "e2e-k"})
    assert replay.status_code == 200 and replay.json() == first.json()
    assert api.post("/jobs", json={"type": "sleep", "queue": "mail"}).status_code == 201
    assert api.post("/jobs", json={"type": "nope"}).status_code == 400
    assert _rejected(api) == {"admission": 2.0, "validation": 1.0}
    document = api.get("/openapi.json").json()
    assert "429" in document["paths"]["/jobs/batch"]["post"]["responses"]

    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM jobqueue.jobs").fetchone() == (4,)
        conn.execute("UPDATE jobqueue.jobs SET status = 'completed' WHERE queue = 'default'")
    drained = time.monotonic()

    def admitted() -> bool:
        return api.post("/jobs", json={"type": "sleep"}).status_code == 201

    wait_for(admitted, 3, "the drained queue to admit jobs again")
    # Within the one-second refresh period (plus this machine's scheduling noise).
    assert time.monotonic() - drained < 2.5
    assert api.service.stop() == 0
