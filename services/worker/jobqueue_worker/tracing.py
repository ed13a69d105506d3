"""The worker's spans (docs/operations.md#tracing): one per attempt, a trace of its own
(an attempt may run long after the request, several times, in another process) linked to
the span that submitted the job. Used only when `jobcore.tracing.start` gave a tracer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobcore import tracing
from jobcore.rows import Claimed

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer


def begin(tracer: Tracer, job: Claimed) -> Span:
    """Start the span of `job`'s attempt, linked to its submit's span when it has one."""
    from opentelemetry import context, trace

    links = []
    if job.traceparent:
        submitted = trace.get_current_span(
            tracing.extract({tracing.TRACEPARENT: job.traceparent})
        ).get_span_context()
        if submitted.is_valid:
            links.append(trace.Link(submitted))
    return tracer.start_span(
        f"attempt {job.type}",
        context=context.Context(),  # a root: a trace of its own
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes={
            "jobqueue.job.id": str(job.id),
            "jobqueue.job.type": job.type,
            "jobqueue.queue": job.queue,
            "jobqueue.attempt": job.attempts,
            "jobqueue.max_attempts": job.max_attempts,
        },
    )


def entered(span: Span) -> Any:
    """Make `span` the current one (for a task created now to inherit); returns the token
    `left` takes."""
    from opentelemetry import context, trace

    return context.attach(trace.set_span_in_context(span))


def left(token: Any) -> None:
    from opentelemetry import context

    context.detach(token)


def end(span: Span, outcome: str, *, applied: bool, error: str | None = None) -> None:
    """End the attempt's span with its outcome (and its error, marking the span failed)."""
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("jobqueue.outcome", outcome)
    span.set_attribute("jobqueue.outcome_applied", applied)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error[:200]))
    span.end()
