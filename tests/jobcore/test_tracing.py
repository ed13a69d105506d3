"""jobcore.tracing (docs/operations.md#tracing): off without OTEL_EXPORTER_OTLP_ENDPOINT; a
job carries a `traceparent` only of a sampled span; a traced caller's enqueued jobs carry
its current span."""

from __future__ import annotations

import sqlalchemy as sa
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

from jobcore import enqueue, tracing
from jobcore.schema import jobs


def test_tracing_is_off_unless_the_endpoint_is_set():
    assert not tracing.enabled({})
    assert not tracing.enabled({tracing.ENDPOINT: "  "})
    assert tracing.enabled({tracing.ENDPOINT: "http://collector:4318"})
    assert tracing.start("x", environ={}) is None
    tracing.check({})  # nothing asked for: nothing to check


def test_only_a_sampled_span_gives_a_traceparent():
    sampled = TracerProvider(sampler=ALWAYS_ON).get_tracer("t")
    dropped = TracerProvider(sampler=ALWAYS_OFF).get_tracer("t")
    with sampled.start_as_current_span("kept") as span:
        context = span.get_span_context()
        assert tracing.traceparent(span) == (
            f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
        )
        assert tracing.current_traceparent() == tracing.traceparent(span)
    with dropped.start_as_current_span("dropped") as span:
        assert tracing.traceparent(span) is None
        assert tracing.current_traceparent() is None
    assert tracing.current_traceparent() is None  # no current span


async def test_an_enqueued_job_carries_the_callers_current_span(engine):
    tracer = TracerProvider(sampler=ALWAYS_ON).get_tracer("t")
    async with engine.begin() as conn:
        with tracer.start_as_current_span("order") as span:
            traced = await enqueue(conn, "sleep", {"duration": "0s"})
        untraced = await enqueue(conn, "sleep", {"duration": "0s"})
    async with engine.connect() as conn:
        rows = {
            row.id: row.traceparent
            for row in await conn.execute(sa.select(jobs.c.id, jobs.c.traceparent))
        }
    assert rows == {traced: tracing.traceparent(span), untraced: None}
