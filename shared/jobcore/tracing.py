"""Optional OpenTelemetry tracing, shared by both services (docs/operations.md#tracing).

Tracing is on when OTEL_EXPORTER_OTLP_ENDPOINT is set (the SDK reads it and the other
standard OTEL_* variables itself) and the `otel` extra is installed. Off, `start` returns
None, nothing of OpenTelemetry is imported, and every caller's cost is one `is None` test.

A job carries its submitting span's context as a W3C `traceparent` string: the API stores
it with the job, the worker's attempt span links to it (an attempt is its own trace: it
may run long after the request, many times, in another process).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jobcore.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACEPARENT = "traceparent"

# The provider behind each tracer `start` gave, for `stop` to flush and shut down.
_providers: dict[int, Any] = {}


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces to be exported."""
    return bool((os.environ if environ is None else environ).get(ENDPOINT, "").strip())


def check(environ: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError when tracing is asked for but the `otel` extra is missing."""
    if not enabled(environ):
        return
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            ENDPOINT,
            f"is set, but the otel extra is not installed (no module {exc.name!r}): "
            "pip install 'jobqueue[otel]'",
        ) from None


def start(
    service: str, *, environ: Mapping[str, str] | None = None, exporter: SpanExporter | None = None
) -> Tracer | None:
    """The process's tracer, exporting in batches over OTLP/HTTP as `service` (unless
    OTEL_SERVICE_NAME names another); None when tracing is off. Its provider becomes the
    process's global one, so a handler's own spans (`opentelemetry.trace.get_tracer`) are
    exported too. `exporter` replaces OTLP (tests). Raises ConfigError when the endpoint is
    set but the `otel` extra is missing."""
    if exporter is None:
        if not enabled(environ):
            return None
        check(environ)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, over the default.
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # the first one a process starts (a service: its only)
    tracer = provider.get_tracer("jobqueue")
    _providers[id(tracer)] = provider
    return tracer


def stop(tracer: Tracer | None) -> None:
    """Export what `tracer` still buffers, then stop its exporter (at shutdown)."""
    if tracer is None:
        return
    provider = _providers.pop(id(tracer), None)
    if provider is not None:
        provider.shutdown()


def traceparent(span: Span) -> str | None:
    """The W3C `traceparent` of `span`; None unless it is sampled (an attempt would link to
    a span no collector ever received)."""
    from opentelemetry.trace import set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = span.get_span_context()
    if not (context.is_valid and context.trace_flags.sampled):
        return None
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(span))
    return carrier.get(TRACEPARENT)


def current_traceparent() -> str | None:
    """The `traceparent` of the caller's current span, when the caller traces (it has
    imported OpenTelemetry, and a sampled span is current); else None, importing nothing."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import trace

    return traceparent(trace.get_current_span())


def extract(headers: Mapping[str, str]) -> Any:
    """The OpenTelemetry context a carrier (HTTP headers, or {"traceparent": ...}) names;
    an empty context when it names none or a malformed one."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(headers)
