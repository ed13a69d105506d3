"""Optional OpenTelemetry tracing, shared by both services (docs/operations.md#tracing).

Tracing is on when OTEL_EXPORTER_OTLP_ENDPOINT is set (the SDK reads it and the other
standard OTEL_* variables itself) and the `otel` extra is installed. Off, `start` returns
None, nothing of OpenTelemetry is imported, and every caller's cost is one `is None` test.
On, `check` validates the OTEL_* variables docs/configuration.md names, which the SDK would
otherwise replace by its defaults with a traceback in the log, or fail on at first use
(an empty one counts as unset, as OpenTelemetry specifies).

`stop` exports what is still buffered within a deadline: a collector that never answers
must not hold a service's exit past its SHUTDOWN_TIMEOUT.

A job carries its submitting span's context as a W3C `traceparent` string: the API stores
it with the job, the worker's attempt span links to it (an attempt is its own trace: it
may run long after the request, many times, in another process).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

from jobcore.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("jobqueue.tracing")

ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
HEADERS = "OTEL_EXPORTER_OTLP_HEADERS"
SAMPLER = "OTEL_TRACES_SAMPLER"
SAMPLER_ARG = "OTEL_TRACES_SAMPLER_ARG"
SCHEDULE_DELAY = "OTEL_BSP_SCHEDULE_DELAY"
EXPORT_TIMEOUT = "OTEL_BSP_EXPORT_TIMEOUT"
MAX_QUEUE_SIZE = "OTEL_BSP_MAX_QUEUE_SIZE"
MAX_EXPORT_BATCH_SIZE = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
TRACEPARENT = "traceparent"

# The SDK's samplers by OTEL_TRACES_SAMPLER value; the ratio ones take OTEL_TRACES_SAMPLER_ARG.
SAMPLERS = (
    "always_on",
    "always_off",
    "parentbased_always_on",
    "parentbased_always_off",
    "traceidratio",
    "parentbased_traceidratio",
)
# A header as the SDK parses OTEL_EXPORTER_OTLP_HEADERS (liberally): `name=value`, the name
# an HTTP token; a pair it cannot parse it drops with a warning (an `authorization` lost).
_HEADER = re.compile(
    r"[ \t]*[\x21\x23-\x27\x2a\x2b\x2d\x2e\x30-\x39\x41-\x5a\x5e-\x7a\x7c\x7e]+[ \t]*"
    r"=[ \t]*[\x20\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*[ \t]*"
)
# Milliseconds the batch processor's waits may take: past an hour is a typo (and past
# threading.TIMEOUT_MAX its thread dies).
_MAX_MILLIS = 3_600_000

# The provider behind each tracer `start` gave, for `stop` to flush and shut down, with
# OTEL_BSP_EXPORT_TIMEOUT in seconds.
_providers: dict[int, tuple[Any, float]] = {}
# The longest `stop` waits in this process (`limit_stop`); None: no limit of its own.
_stop_limit: float | None = None


class Batching(NamedTuple):
    """The batch span processor's settings (OTEL_BSP_*, the SDK's defaults when unset)."""

    schedule_delay_millis: int = 5000
    export_timeout_millis: int = 30000
    max_queue_size: int = 2048
    max_export_batch_size: int = 512


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces to be exported."""
    return bool((os.environ if environ is None else environ).get(ENDPOINT, "").strip())


def check(environ: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError, naming the variable, when tracing is asked for but the `otel`
    extra is missing or an OTEL_* variable is invalid (nothing to check with tracing off)."""
    if not enabled(environ):
        return
    env = os.environ if environ is None else environ
    _check_endpoint(env[ENDPOINT].strip())
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            ENDPOINT,
            f"is set, but the otel extra is not installed (no module {exc.name!r}): "
            "pip install 'jobqueue[otel]'",
        ) from None
    for header in re.split(r"[ \t]*,[ \t]*", env.get(HEADERS, "")):
        if header.strip() and not _HEADER.fullmatch(header.strip()):
            raise ConfigError(
                HEADERS,
                f"must be comma-separated name=value pairs, URL-encoded (got {_redacted(header)})",
            )
    sampler = env.get(SAMPLER, "").lower()  # as the SDK compares it
    if sampler.strip() and sampler not in SAMPLERS:
        raise ConfigError(SAMPLER, f"must be one of {', '.join(SAMPLERS)} (got {sampler!r})")
    argument = env.get(SAMPLER_ARG, "").strip()
    if sampler.endswith("traceidratio") and argument:
        try:
            ratio = float(argument)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(
                SAMPLER_ARG, f"must be a ratio from 0 to 1 for {sampler} (got {argument!r})"
            )
    batching(env)


def batching(environ: Mapping[str, str] | None = None) -> Batching:
    """The OTEL_BSP_* settings; ConfigError naming the first invalid one. The SDK would take
    a non-integer for its default (logging a traceback) and raise on the others."""
    env = os.environ if environ is None else environ
    defaults = Batching()
    values: dict[str, int] = {}
    for field, variable, limit in (
        ("schedule_delay_millis", SCHEDULE_DELAY, _MAX_MILLIS),
        ("export_timeout_millis", EXPORT_TIMEOUT, _MAX_MILLIS),
        ("max_queue_size", MAX_QUEUE_SIZE, None),
        ("max_export_batch_size", MAX_EXPORT_BATCH_SIZE, None),
    ):
        raw = env.get(variable, "").strip()
        if not raw:
            values[field] = getattr(defaults, field)
            continue
        what = "milliseconds" if limit else "spans"
        if not re.fullmatch(r"[0-9]{1,12}", raw) or int(raw) == 0:
            raise ConfigError(variable, f"must be a positive integer ({what}) (got {raw!r})")
        if limit is not None and int(raw) > limit:
            raise ConfigError(variable, f"must be at most {limit} ({what}) (got {raw!r})")
        values[field] = int(raw)
    found = Batching(**values)
    if found.max_export_batch_size > found.max_queue_size:
        raise ConfigError(
            MAX_EXPORT_BATCH_SIZE,
            f"must not exceed {MAX_QUEUE_SIZE} ({found.max_queue_size}) "
            f"(got {found.max_export_batch_size})",
        )
    return found


def _check_endpoint(url: str) -> None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a port out of range)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            ENDPOINT, f"must be an http:// or https:// URL of an OTLP/HTTP collector (got {url!r})"
        )


def _redacted(header: str) -> str:
    """A header for an error line, its value left out (it may be a credential)."""
    name, equals, _ = header.partition("=")
    return f"{name.strip()}=..." if equals else "a pair without '='"


def start(
    service: str, *, environ: Mapping[str, str] | None = None, exporter: SpanExporter | None = None
) -> Tracer | None:
    """The process's tracer, exporting in batches over OTLP/HTTP as `service` (unless
    OTEL_SERVICE_NAME names another); None when tracing is off. Its provider becomes the
    process's global one, so a handler's own spans (`opentelemetry.trace.get_tracer`) are
    exported too. `exporter` replaces OTLP (tests). Raises ConfigError when the endpoint is
    set but the `otel` extra is missing, or an OTEL_* variable is invalid (`check`)."""
    if exporter is None:
        if not enabled(environ):
            return None
        check(environ)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    settings = batching(environ)
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, over the default.
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter,
            max_queue_size=settings.max_queue_size,
            schedule_delay_millis=settings.schedule_delay_millis,
            max_export_batch_size=settings.max_export_batch_size,
            export_timeout_millis=settings.export_timeout_millis,
        )
    )
    trace.set_tracer_provider(provider)  # the first one a process starts (a service: its only)
    tracer = provider.get_tracer("jobqueue")
    _providers[id(tracer)] = (provider, settings.export_timeout_millis / 1000)
    return tracer


def stop(tracer: Tracer | None, timeout: float | None = None) -> bool:
    """Export what `tracer` still buffers, then stop its exporter (at shutdown), waiting at
    most `timeout` seconds (default: OTEL_BSP_EXPORT_TIMEOUT). The SDK's own shutdown waits
    up to 30 s, and then for the export in flight (OTEL_EXPORTER_OTLP_TIMEOUT, retried):
    it runs in a daemon thread, left behind at the deadline with what it still holds, and
    this returns False after a warning line. True when everything was exported (or there
    was nothing to stop). Calling it again does nothing."""
    if tracer is None:
        return True
    stopping = _providers.pop(id(tracer), None)
    if stopping is None:
        return True
    provider, limit = stopping
    for bound in (timeout, _stop_limit):
        if bound is not None:
            limit = min(limit, max(bound, 0.0))
    done = threading.Event()

    def shut_down() -> None:
        try:
            provider.shutdown()
        except Exception:  # an exporter's bug: the spans are lost either way
            log.warning("tracer provider shutdown failed", exc_info=True)
        finally:
            done.set()

    threading.Thread(target=shut_down, name="jobqueue-tracing-stop", daemon=True).start()
    if done.wait(limit):
        return True
    log.warning(
        "spans not exported before the shutdown deadline: dropped",
        extra={"timeout": round(limit, 3)},
    )
    return False


def limit_stop(seconds: float) -> None:
    """Make `stop` wait at most `seconds` in this process, whatever its caller asks."""
    global _stop_limit
    _stop_limit = seconds


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
