"""The attempt's span (docs/operations.md#tracing), recorded in memory: one per attempt, a
trace of its own linked to the submitting span, ended with the attempt's outcome; the
handler runs inside it, so its own spans nest under the attempt."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from jobcore import JobContext, handler, tracing
from jobcore.states import Status
from tests.worker.fakestore import FakeStore
from tests.worker.stack import Stack
from tests.worker.support import until

SUBMIT_TRACE = "0af7651916cd43dd8448eb211c80319c"
SUBMIT_SPAN = "b7ad6b7169203331"
current: dict[str, Any] = {}


@handler("unit.trace.async")
async def in_loop(payload: Any, ctx: JobContext) -> None:
    current["async"] = trace.get_current_span().get_span_context()


@handler("unit.trace.sync")
def in_thread(payload: Any, ctx: JobContext) -> None:
    current["sync"] = trace.get_current_span().get_span_context()


@handler("unit.trace.boom")
async def boom(payload: Any, ctx: JobContext) -> None:
    raise ValueError("boom")


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, InMemorySpanExporter]]:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    exported = InMemorySpanExporter()
    tracer = tracing.start("jobqueue-worker", exporter=exported)
    yield tracer, exported
    tracing.stop(tracer)


async def _attempted(store: FakeStore, tracer: Any, exported: InMemorySpanExporter, spans: int):
    def settled() -> bool:
        return all(j.status is not Status.PROCESSING and j.attempts for j in store.jobs.values())

    async with Stack(store, tracer=tracer):
        await until(settled, 20, "every job attempted once and recorded")
    await until(lambda: len(exported.get_finished_spans()) >= spans, 10, f"{spans} spans")
    return {span.attributes["jobqueue.job.id"]: span for span in exported.get_finished_spans()}


async def test_each_attempt_is_a_span_linked_to_its_submit_with_the_handler_inside(traced):
    tracer, exported = traced
    store = FakeStore()
    linked = store.add("unit.trace.async", traceparent=f"00-{SUBMIT_TRACE}-{SUBMIT_SPAN}-01")
    plain = store.add("unit.trace.sync")
    spans = await _attempted(store, tracer, exported, 2)

    first, second = spans[str(linked)], spans[str(plain)]
    assert first.name == "attempt unit.trace.async" and first.kind == SpanKind.CONSUMER
    assert first.parent is None  # a trace of its own
    ((link),) = first.links
    assert format(link.context.trace_id, "032x") == SUBMIT_TRACE
    assert format(link.context.span_id, "016x") == SUBMIT_SPAN
    assert first.attributes["jobqueue.outcome"] == "completed"
    assert first.attributes["jobqueue.outcome_applied"] is True
    assert first.resource.attributes["service.name"] == "jobqueue-worker"
    assert current["async"] == first.context  # async handlers run inside the attempt's span
    assert current["sync"] == second.context  # and so do plain ones, in their thread
    assert not second.links  # submitted without tracing


async def test_a_failed_attempt_ends_its_span_in_error_with_the_outcome(traced):
    tracer, exported = traced
    store = FakeStore()
    job = store.add("unit.trace.boom", max_attempts=1)
    span = (await _attempted(store, tracer, exported, 1))[str(job)]
    assert span.attributes["jobqueue.outcome"] == "dead_letter"
    assert span.status.status_code == StatusCode.ERROR
    assert "boom" in (span.status.description or "")
