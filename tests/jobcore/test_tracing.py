"""jobcore.tracing (docs/operations.md#tracing): off without OTEL_EXPORTER_OTLP_ENDPOINT; the
OTEL_* variables it documents are checked at startup; `stop` waits no longer than told; a
job carries a `traceparent` only of a sampled span; a traced caller's enqueued jobs carry
its current span."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

from jobcore import enqueue, tracing
from jobcore.errors import ConfigError
from jobcore.schema import jobs

ON = {tracing.ENDPOINT: "http://collector:4318"}


def test_tracing_is_off_unless_the_endpoint_is_set():
    assert not tracing.enabled({})
    assert not tracing.enabled({tracing.ENDPOINT: "  "})
    assert tracing.enabled({tracing.ENDPOINT: "http://collector:4318"})
    assert tracing.start("x", environ={}) is None
    tracing.check({})  # nothing asked for: nothing to check


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({tracing.ENDPOINT: "collector:4318"}, tracing.ENDPOINT),
        ({tracing.ENDPOINT: "ftp://collector"}, tracing.ENDPOINT),
        ({tracing.ENDPOINT: "http://collector:99999"}, tracing.ENDPOINT),
        ({"OTEL_BSP_SCHEDULE_DELAY": "abc"}, "OTEL_BSP_SCHEDULE_DELAY"),
        ({"OTEL_BSP_SCHEDULE_DELAY": "0"}, "OTEL_BSP_SCHEDULE_DELAY"),
        ({"OTEL_BSP_SCHEDULE_DELAY": "1.5"}, "OTEL_BSP_SCHEDULE_DELAY"),
        ({"OTEL_BSP_SCHEDULE_DELAY": "99999999999"}, "OTEL_BSP_SCHEDULE_DELAY"),
        ({"OTEL_BSP_EXPORT_TIMEOUT": "-5"}, "OTEL_BSP_EXPORT_TIMEOUT"),
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "0"}, "OTEL_BSP_MAX_QUEUE_SIZE"),
        ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "lots"}, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
        # Above the default queue size (2048), and above a queue size given.
        ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4096"}, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
        (
            {"OTEL_BSP_MAX_QUEUE_SIZE": "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "200"},
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        ),
        ({"OTEL_EXPORTER_OTLP_HEADERS": "Bearer secret"}, "OTEL_EXPORTER_OTLP_HEADERS"),
        ({"OTEL_EXPORTER_OTLP_HEADERS": "a=b,=c"}, "OTEL_EXPORTER_OTLP_HEADERS"),
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"},
            "OTEL_TRACES_SAMPLER_ARG",
        ),
        (
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
            "OTEL_TRACES_SAMPLER_ARG",
        ),
    ],
)
def test_an_invalid_otel_variable_is_a_config_error_naming_it(env, variable):
    with pytest.raises(ConfigError) as raised:
        tracing.check({**ON, **env})
    assert raised.value.variable == variable
    assert "secret" not in str(raised.value)  # a header's value may be a credential
    tracing.check(env if variable != tracing.ENDPOINT else {})  # tracing off: not checked


def test_valid_otel_variables_pass_and_give_the_batch_settings():
    env = {
        **ON,
        "OTEL_BSP_SCHEDULE_DELAY": " 50 ",
        "OTEL_BSP_EXPORT_TIMEOUT": "",  # empty: unset, as OpenTelemetry specifies
        "OTEL_BSP_MAX_QUEUE_SIZE": "100",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "100",
        "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20x, x-tenant = acme ,",
        "OTEL_TRACES_SAMPLER": "ParentBased_TraceIdRatio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
    }
    tracing.check(env)
    assert tracing.batching(env) == tracing.Batching(50, 30000, 100, 100)
    assert tracing.batching({}) == tracing.Batching()
    tracing.check(
        {tracing.ENDPOINT: "https://[::1]:4318/prefix", "OTEL_TRACES_SAMPLER": "always_off"}
    )


class Hanging(SpanExporter):
    """An exporter whose exports never return until released: a collector that never answers."""

    def __init__(self) -> None:
        self.exporting = threading.Event()
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exporting.set()
        self.release.wait(30)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


@pytest.fixture
def hanging(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hanging]:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
    exporter = Hanging()
    yield exporter
    exporter.release.set()


def test_stop_gives_up_at_its_timeout_when_the_exporter_hangs(hanging, caplog):
    tracer = tracing.start("x", exporter=hanging)
    assert tracer is not None
    with tracer.start_as_current_span("exported, hanging"):
        pass
    assert hanging.exporting.wait(10)
    with tracer.start_as_current_span("still buffered"):
        pass
    began = time.monotonic()
    assert tracing.stop(tracer, 0.3) is False
    assert 0.3 <= time.monotonic() - began < 2
    assert "spans not exported before the shutdown deadline: dropped" in caplog.messages
    assert tracing.stop(tracer, 5) is True  # stopped already: nothing to wait for


def test_limit_stop_bounds_every_stop_of_the_process(hanging, monkeypatch):
    monkeypatch.setattr(tracing, "_stop_limit", None)
    tracer = tracing.start("x", exporter=hanging)
    with tracer.start_as_current_span("hanging"):  # type: ignore[union-attr]
        pass
    assert hanging.exporting.wait(10)
    tracing.limit_stop(0.2)
    began = time.monotonic()
    assert tracing.stop(tracer) is False  # unbounded by its caller: the process's limit
    assert time.monotonic() - began < 2


def test_stop_exports_what_is_buffered_when_the_exporter_answers(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")  # only the stop exports
    exported = InMemorySpanExporter()
    tracer = tracing.start("x", exporter=exported)
    with tracer.start_as_current_span("buffered"):  # type: ignore[union-attr]
        pass
    assert tracing.stop(tracer, 5) is True
    assert [span.name for span in exported.get_finished_spans()] == ["buffered"]


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
