"""Request ids, the access log, the JSON error envelope, authentication and the body limit."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue_api import calls
from tests.api.conftest import LogCapture, MakeApi, app_of, job_count

GENERATED_ID = re.compile(r"[0-9a-f]{32}")


# --- request ids and the access log ------------------------------------------------------


async def test_request_id_is_generated_when_absent(api: httpx.AsyncClient):
    r = await api.get("/healthz")
    assert GENERATED_ID.fullmatch(r.headers["x-request-id"])
    assert r.headers["x-request-id"] != (await api.get("/healthz")).headers["x-request-id"]


async def test_a_sane_request_id_is_echoed(api: httpx.AsyncClient):
    for rid in ("abc-123", "trace:7f/span=2@svc", "x" * 128):
        r = await api.get("/healthz", headers={"X-Request-ID": rid})
        assert r.headers["x-request-id"] == rid


async def test_an_insane_request_id_is_replaced(api: httpx.AsyncClient):
    for rid in ("x" * 129, "has spaces", 'quote"s', "{json}", "é"):
        r = await api.get("/healthz", headers=[(b"X-Request-ID", rid.encode())])
        assert GENERATED_ID.fullmatch(r.headers["x-request-id"]), rid


async def test_every_response_carries_a_request_id(make_api: MakeApi):
    api = await make_api(API_TOKENS="secret", MAX_BODY_BYTES="100")
    auth = {"Authorization": "Bearer secret"}
    responses = [
        await api.get("/nowhere"),  # 404
        await api.delete("/healthz"),  # 405
        await api.post("/jobs"),  # 401
        await api.post("/jobs", headers=auth, content=b"x" * 200),  # 413
        await api.post("/jobs", headers=auth, content=b"{"),  # 400
        await api.post("/jobs", headers=auth, json={"type": "sleep"}),  # 201
        await api.get("/metrics"),
        await api.get("/openapi.json"),
    ]
    assert [r.status_code for r in responses] == [404, 405, 401, 413, 400, 201, 200, 200]
    for r in responses:
        assert r.headers.get("x-request-id"), r.request.url


async def test_every_log_line_of_a_request_carries_its_id(
    api: httpx.AsyncClient, captured_logs: LogCapture
):
    r = await api.post("/jobs", json={"type": "sleep"}, headers={"X-Request-ID": "req-42"})
    mine = [line for line in captured_logs.lines() if line.get("request_id") == "req-42"]
    messages = [line["msg"] for line in mine]
    assert "job submitted" in messages and "request" in messages
    submitted = next(line for line in mine if line["msg"] == "job submitted")
    assert submitted["job_id"] == r.json()["id"]
    access = next(line for line in mine if line["msg"] == "request")
    assert access["method"] == "POST" and access["path"] == "/jobs"
    assert access["status"] == 201 and access["duration_ms"] >= 0
    # Lines logged outside any request carry no request id.
    others = [line for line in captured_logs.lines() if line not in mine]
    assert all("request_id" not in line or line["request_id"] != "req-42" for line in others)


async def test_one_access_log_line_per_request(api: httpx.AsyncClient, captured_logs: LogCapture):
    for path in ("/healthz", "/nowhere", "/jobs/abc"):
        await api.get(path, headers={"X-Request-ID": f"id{path.replace('/', '-')}"})
    access = [line for line in captured_logs.lines() if line["msg"] == "request"]
    assert [(a["path"], a["status"]) for a in access] == [
        ("/healthz", 200),
        ("/nowhere", 404),
        ("/jobs/abc", 404),
    ]
    assert {a["request_id"] for a in access} == {"id-healthz", "id-nowhere", "id-jobs-abc"}


# --- the error envelope ---------------------------------------------------------------


async def test_unknown_route_is_a_json_404(api: httpx.AsyncClient):
    for path in ("/nowhere", "/jobs/", "/jobs/x/y", "/JOBS"):
        r = await api.get(path)
        assert r.status_code == 404, path
        assert r.headers["content-type"] == "application/json"
        assert set(r.json()) == {"error"}


async def test_wrong_method_is_a_json_405_with_allow(api: httpx.AsyncClient):
    for method, path in (("PUT", "/jobs"), ("DELETE", "/jobs/x"), ("PUT", "/healthz")):
        r = await api.request(method, path)
        assert r.status_code == 405, (method, path)
        assert set(r.json()) == {"error"} and method in r.json()["error"]
        assert r.headers["allow"]
    # GET lists and POST submits: the one route answers both, and says so.
    allowed = (await api.delete("/jobs")).headers["allow"]
    assert {"GET", "POST"} <= {method.strip() for method in allowed.split(",")}
    cancel = await api.get("/jobs/x/cancel")
    assert (cancel.status_code, cancel.headers["allow"]) == (405, "POST")


async def test_an_unexpected_error_is_a_json_500_without_traceback(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, captured_logs: LogCapture
):
    async def broken(*args: object) -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(calls, "get", broken)
    r = await api.get("/jobs/01890000-0000-7000-8000-000000000000", headers={"X-Request-ID": "e1"})
    assert r.status_code == 500
    assert r.json() == {"error": "internal error"}
    assert r.headers["x-request-id"] == "e1"
    logged = [line for line in captured_logs.lines() if line.get("request_id") == "e1"]
    assert any("secret internals" in line.get("exc", "") for line in logged)


async def test_a_connection_error_is_a_json_503(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
):
    async def unreachable(*args: object, **kwargs: object) -> None:
        raise ConnectionRefusedError("connect call failed")

    monkeypatch.setattr(calls, "submit", unreachable)
    r = await api.post("/jobs", json={"type": "sleep"})
    assert r.status_code == 503
    assert r.json() == {"error": "database unavailable"}


# --- authentication -------------------------------------------------------------------


async def test_with_tokens_job_endpoints_require_a_bearer_token(
    make_api: MakeApi, engine: AsyncEngine
):
    api = await make_api(API_TOKENS="alpha, beta")
    attempts = [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Bearer alph"},
        {"Authorization": "Bearer alphaa"},
        {"Authorization": "Basic YWxwaGE6"},
        {"Authorization": "alpha"},
        {"Authorization": "Bearer "},
    ]
    for headers in attempts:
        for method, path in (
            ("POST", "/jobs"),
            ("GET", "/jobs"),
            ("GET", "/jobs/x"),
            ("GET", "/jobs/x?wait=1s"),
            ("GET", "/jobs/x/status"),
            ("POST", "/jobs/x/retry"),
            ("POST", "/jobs/x/cancel"),
            ("GET", "/queues"),
        ):
            r = await api.request(method, path, headers=headers, json={"type": "sleep"})
            assert r.status_code == 401, (headers, path)
            assert r.headers["www-authenticate"] == "Bearer"
            assert set(r.json()) == {"error"}
    assert await job_count(engine) == 0


async def test_each_configured_token_is_accepted(make_api: MakeApi):
    api = await make_api(API_TOKENS="alpha,beta")
    for token in ("alpha", "beta"):
        for scheme in ("Bearer", "bearer"):
            headers = {"Authorization": f"{scheme} {token}"}
            r = await api.post("/jobs", json={"type": "sleep"}, headers=headers)
            assert r.status_code == 201
            assert (await api.get(r.headers["location"], headers=headers)).status_code == 200


async def test_health_readiness_metrics_and_openapi_stay_open_with_tokens(make_api: MakeApi):
    api = await make_api(API_TOKENS="alpha")
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert (await api.get(path)).status_code == 200, path


async def test_without_tokens_the_api_is_open(api: httpx.AsyncClient):
    assert (await api.post("/jobs", json={"type": "sleep"})).status_code == 201


# --- the body limit --------------------------------------------------------------------


def _streamed(total: int, chunk: int, sent: list[int]) -> AsyncIterator[bytes]:
    async def body() -> AsyncIterator[bytes]:
        block = b" " * chunk
        while sent[0] < total:
            sent[0] += chunk
            yield block

    return body()


async def test_an_oversized_streamed_body_is_413_without_reading_it_all(
    make_api: MakeApi, engine: AsyncEngine
):
    api = await make_api(MAX_BODY_BYTES="1048576")
    sent = [0]
    chunk = 64 * 1024
    r = await api.post("/jobs", content=_streamed(1 << 30, chunk, sent))  # 1 GiB, chunked
    assert r.status_code == 413
    assert "MAX_BODY_BYTES" in r.json()["error"]
    assert sent[0] <= 1048576 + chunk  # stopped at the limit: 1 MiB read of 1 GiB
    assert await job_count(engine) == 0


async def test_a_too_large_content_length_is_refused_before_reading(make_api: MakeApi):
    api = await make_api(MAX_BODY_BYTES="1024")
    sent = [0]
    r = await api.post(
        "/jobs",
        content=_streamed(1 << 30, 1024, sent),
        headers={"Content-Length": str(1 << 30)},
    )
    assert r.status_code == 413 and set(r.json()) == {"error"}
    assert sent[0] == 0


async def test_a_body_of_exactly_max_body_bytes_is_accepted(make_api: MakeApi, engine: AsyncEngine):
    api = await make_api(MAX_BODY_BYTES="1024")
    head = b'{"type":"sleep","payload":"'
    tail = b'"}'
    fits = head + b"x" * (1024 - len(head) - len(tail)) + tail
    assert (await api.post("/jobs", content=fits)).status_code == 201
    over = head + b"x" * (1025 - len(head) - len(tail)) + tail
    assert (await api.post("/jobs", content=over)).status_code == 413
    assert await job_count(engine) == 1


async def test_a_client_that_disconnects_mid_body_is_logged_not_answered(
    api: httpx.AsyncClient, engine: AsyncEngine, captured_logs: LogCapture
):
    app = app_of(api)
    messages = [
        {"type": "http.request", "body": b'{"type": "sl', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return messages.pop(0)

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/jobs",
        "raw_path": b"/jobs",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"x-request-id", b"gone-1")],
        "server": ("api", 80),
        "client": ("127.0.0.1", 1),
    }
    await app(scope, receive, send)
    assert sent == []
    lines = [line for line in captured_logs.lines() if line.get("request_id") == "gone-1"]
    assert [(line["msg"], line.get("status")) for line in lines] == [("request", 499)]
    assert await job_count(engine) == 0
