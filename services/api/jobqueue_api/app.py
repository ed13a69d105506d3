"""`create_app(settings, engine)`: the Starlette application with its routes and middleware.

The process-level state the app reads lives on `app.state`: `engine`, `settings`,
`groups` (the submits sharing statements), `admission` (None without MAX_PENDING),
`waiters` (the requests waiting for jobs to finish, and their listening connection), and
`shutting_down` (set by `shut_down` when a signal arrives). `close(app)` releases what the
app holds besides the engine.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from jobcore.registry import registered_types
from jobcore.settings import Settings
from jobqueue_api import jobs, listing, metrics, openapi, ui
from jobqueue_api.admission import Admission
from jobqueue_api.errors import error_response, http_error
from jobqueue_api.groups import SubmitGroups
from jobqueue_api.hot import HotRoute
from jobqueue_api.middleware import Authenticate, LimitBody, RequestContext
from jobqueue_api.notify import Notifier
from jobqueue_api.tracing import TraceRequests
from jobqueue_api.waiters import Waiters

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

# Readiness must answer well before a prober's own timeout (often 1 s to a few).
READY_TIMEOUT = 2.0


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    if request.app.state.shutting_down:
        return error_response(503, "shutting down")
    engine: AsyncEngine = request.app.state.engine
    try:
        async with asyncio.timeout(READY_TIMEOUT), engine.connect() as conn:
            await conn.execute(sa.text("SELECT 1"))
    except Exception:  # any failure means "not ready"; the reason is in the access log status
        return error_response(503, "database unavailable")
    return JSONResponse({"status": "ready"})


async def metrics_page(request: Request) -> Response:
    body, content_type = metrics.render()
    return Response(body, media_type=content_type)


async def openapi_json(request: Request) -> Response:
    return JSONResponse(request.app.state.openapi)


async def jobs_collection(request: Request) -> Response:
    """`/jobs` is one route (so a 405 lists both methods): POST submits (served ahead of the
    router by `HotRoute`), GET lists."""
    if request.method == "POST":
        return await jobs.create_job(request)
    return await listing.list_jobs(request)


def create_app(settings: Settings, engine: AsyncEngine, tracer: Tracer | None = None) -> Starlette:
    """The app; `tracer` (from `jobcore.tracing.start`) traces requests and submits."""
    collection = Route("/jobs", jobs_collection, methods=["GET", "POST"])
    routes = [
        collection,
        Route("/jobs/batch", jobs.create_many, methods=["POST"]),
        Route("/jobs/{id}", jobs.get_job, methods=["GET"]),
        Route("/jobs/{id}/status", jobs.get_status, methods=["GET"]),
        Route("/jobs/{id}/retry", jobs.retry_job, methods=["POST"]),
        Route("/jobs/{id}/cancel", jobs.cancel_job, methods=["POST"]),
        Route("/queues", listing.queues, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_page, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        *ui.routes(),
    ]
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(RequestContext, routes=routes),
            *([Middleware(TraceRequests, tracer=tracer, routes=routes)] if tracer else []),
            # Without API_TOKENS it would let everything through: not installed at all.
            *([Middleware(Authenticate, tokens=settings.tokens)] if settings.tokens else []),
            Middleware(
                LimitBody, limit=settings.max_body_bytes, timeout=settings.request_body_timeout
            ),
            Middleware(HotRoute, route=collection),
        ],
        exception_handlers={HTTPException: http_error},
    )
    # `/jobs/` is not `/jobs`: a 404, never a redirect.
    app.router.redirect_slashes = False
    app.state.engine = engine
    app.state.notifier = Notifier(engine)
    app.state.groups = SubmitGroups(engine, app.state.notifier)
    app.state.waiters = Waiters(settings.database_url)
    app.state.settings = settings
    app.state.tracer = tracer
    app.state.shutting_down = False
    app.state.admission = Admission.of(settings)
    app.state.openapi = openapi.document(
        registered_types(),
        auth=bool(settings.tokens),
        default_max_attempts=settings.max_attempts,
        admission=app.state.admission is not None,
    )
    return app


def shut_down(app: Starlette) -> None:
    """A shutdown begins: /readyz answers 503, and waiting requests are answered now with
    their job as it is (a wait must not hold the shutdown; the client asks again, of a
    process that is not stopping)."""
    app.state.shutting_down = True
    waiters: Waiters = app.state.waiters
    waiters.release()


async def close(app: Starlette) -> None:
    """Answer the waiters, close their listening connection, let the submit groups and a
    NOTIFY in flight end."""
    waiters: Waiters = app.state.waiters
    groups: SubmitGroups = app.state.groups
    notifier: Notifier = app.state.notifier
    await waiters.close()
    await groups.close()
    await notifier.close()
