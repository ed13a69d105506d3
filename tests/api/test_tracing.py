"""The API's spans (docs/operations.md#tracing), recorded in memory: a request continues the
caller's trace, a submit is its child, and the jobs it writes carry the submit's context."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from jobcore import tracing
from jobcore.schema import jobs
from jobcore.settings import load_api_settings
from jobqueue_api.app import close, create_app
from jobqueue_api.database import open_engine
from jobqueue_api.state import state_of
from tests.api.conftest import app_of
from tests.worker.support import eventually

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"


@pytest.fixture
async def traced(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[httpx.AsyncClient, InMemorySpanExporter]]:
    """A client of the app with a tracer exporting to memory; `client.app` is the app."""
    exported = InMemorySpanExporter()
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")  # ms between exports (5 s by default)
    tracer = tracing.start("jobqueue-api", exporter=exported)
    settings = load_api_settings({"DATABASE_URL": database_url})
    engine = open_engine(settings.database_url)
    app = create_app(settings, engine, tracer)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")
    client.app = app  # type: ignore[attr-defined]
    try:
        yield client, exported
    finally:
        await close(app)
        await client.aclose()
        await engine.dispose()
        tracing.stop(tracer)


def _traceparent(span) -> str:
    context = span.context
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _spans(exported: InMemorySpanExporter, count: int):
    async def ready() -> bool:
        return len(exported.get_finished_spans()) >= count

    return ready


async def _traceparents(engine, ids) -> dict[str, str | None]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.select(jobs.c.id, jobs.c.traceparent).where(jobs.c.id.in_(ids))
        )
        return {str(job_id): value for job_id, value in rows}


async def test_a_submit_continues_the_callers_trace_and_the_job_carries_the_submit_span(
    traced, engine
):
    client, exported = traced
    answer = await client.post(
        "/jobs",
        json={"type": "sleep", "payload": {"duration": "0s"}},
        headers={"traceparent": CALLER},
    )
    assert answer.status_code == 201
    job_id = answer.json()["id"]
    await eventually(_spans(exported, 2), 10, "two spans")
    by_name = {span.name: span for span in exported.get_finished_spans()}
    request, submit = by_name["POST /jobs"], by_name["submit"]

    assert request.kind == SpanKind.SERVER
    assert format(request.context.trace_id, "032x") == CALLER_TRACE
    assert format(request.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert request.attributes["http.route"] == "/jobs"
    assert request.attributes["http.response.status_code"] == 201
    assert request.resource.attributes["service.name"] == "jobqueue-api"

    assert submit.parent.span_id == request.context.span_id
    assert submit.context.trace_id == request.context.trace_id
    assert submit.attributes["jobqueue.job.id"] == job_id
    assert submit.attributes["jobqueue.job.type"] == "sleep"
    stored = (await _traceparents(engine, [job_id]))[job_id]
    assert stored == _traceparent(submit) == f"00-{CALLER_TRACE}-{submit.context.span_id:016x}-01"


async def test_a_batch_is_one_submit_span_and_every_job_carries_it(traced, engine):
    client, exported = traced
    answer = await client.post(
        "/jobs/batch", json={"jobs": [{"type": "sleep", "payload": {"duration": "0s"}}] * 3}
    )
    assert answer.status_code == 200, answer.text
    ids = [item["id"] for item in answer.json()["results"]]
    await eventually(_spans(exported, 2), 10, "two spans")
    (submit,) = [span for span in exported.get_finished_spans() if span.name == "submit"]
    (request,) = [span for span in exported.get_finished_spans() if span.name != "submit"]
    assert request.name == "POST /jobs/batch" and request.parent is None  # a new trace
    assert submit.attributes["jobqueue.jobs"] == 3
    assert set((await _traceparents(engine, ids)).values()) == {_traceparent(submit)}


async def test_requests_are_named_by_route_and_a_server_error_marks_the_span(traced):
    client, exported = traced
    missing = "0192f6c5-0000-7000-8000-000000000000"
    assert (await client.get(f"/jobs/{missing}")).status_code == 404
    await eventually(_spans(exported, 1), 10, "a span")
    (span,) = exported.get_finished_spans()
    assert span.name == "GET /jobs/{id}"
    assert span.attributes["url.path"] == f"/jobs/{missing}"
    assert span.status.status_code == StatusCode.UNSET  # a 4xx is the caller's error

    exported.clear()
    # The same app, tracer and exporter, on a database that cannot be reached.
    state = state_of(app_of(client))
    unreachable = open_engine("postgresql+asyncpg://nobody@127.0.0.1:1/none")
    broken = create_app(state.settings, unreachable, state.tracer)
    transport = httpx.ASGITransport(app=broken)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as other:
            assert (await other.get(f"/jobs/{missing}")).status_code >= 500
    finally:
        await close(broken)
        await unreachable.dispose()
    await eventually(_spans(exported, 1), 10, "a span")
    (span,) = exported.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR


async def test_without_a_tracer_no_span_middleware_is_installed_and_jobs_carry_none(api, engine):
    app = app_of(api)
    assert state_of(app).tracer is None
    assert not [m for m in app.user_middleware if m.cls.__name__ == "TraceRequests"]
    answer = await api.post(
        "/jobs",
        json={"type": "sleep", "payload": {"duration": "0s"}},
        headers={"traceparent": CALLER},
    )
    job_id = answer.json()["id"]
    assert (await _traceparents(engine, [job_id]))[job_id] is None
