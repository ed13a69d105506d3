"""The API's spans (docs/operations.md#tracing): one per HTTP request, continuing the
caller's trace when it sends `traceparent`, and one per submit, whose context is stored
with the jobs it writes. Used only when `jobcore.tracing.start` gave a tracer: with
tracing off the middleware is not installed and `submitting` hands the jobs back as they
are."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jobcore import tracing
from jobcore.rows import NewJob
from jobqueue_api.middleware import route_template

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

_CARRIED = (b"traceparent", b"tracestate")


class TraceRequests:
    """A SERVER span per HTTP request, named by method and route template."""

    def __init__(self, app: ASGIApp, tracer: Tracer, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.tracer = tracer
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from opentelemetry.trace import SpanKind, Status, StatusCode

        carrier = {
            k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in _CARRIED
        }
        route = route_template(self.routes, scope)
        with self.tracer.start_as_current_span(
            f"{scope['method']} {route}",
            context=tracing.extract(carrier),
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": scope["method"],
                "http.route": route,
                "url.path": scope["path"],
            },
        ) as span:

            async def send_status(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status = message["status"]
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                await send(message)

            await self.app(scope, receive, send_status)


def submitting(tracer: Tracer | None, jobs: Sequence[NewJob]) -> Any:
    """A context manager giving `jobs` back, each carrying the span of their submit (a
    child of the request's span) when tracing is on."""
    if tracer is None:
        return contextlib.nullcontext(jobs)
    return _submit_span(tracer, jobs)


@contextlib.contextmanager
def _submit_span(tracer: Tracer, jobs: Sequence[NewJob]) -> Iterator[Sequence[NewJob]]:
    attributes: dict[str, Any] = {"jobqueue.jobs": len(jobs)}
    if len(jobs) == 1:
        attributes.update(
            {
                "jobqueue.job.id": str(jobs[0].id),
                "jobqueue.job.type": jobs[0].type,
                "jobqueue.queue": jobs[0].queue,
            }
        )
    with tracer.start_as_current_span("submit", attributes=attributes) as span:
        parent = tracing.traceparent(span)
        yield [new._replace(traceparent=parent) for new in jobs]
