"""`create_app(settings, engine)`: the Starlette application with its routes and middleware.

The process-level state the app reads lives on `app.state`: `engine`,
`settings`, `admission` (None without MAX_PENDING), and `shutting_down` (set by
`main` when a signal arrives).
"""

from __future__ import annotations

import asyncio

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
from jobqueue_api import jobs, metrics, openapi
from jobqueue_api.admission import Admission
from jobqueue_api.errors import error_response, http_error
from jobqueue_api.middleware import Authenticate, LimitBody, RequestContext
from jobqueue_api.notify import Notifier

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


def create_app(settings: Settings, engine: AsyncEngine) -> Starlette:
    routes = [
        Route("/jobs", jobs.create_job, methods=["POST"]),
        Route("/jobs/batch", jobs.create_many, methods=["POST"]),
        Route("/jobs/{id}", jobs.get_job, methods=["GET"]),
        Route("/jobs/{id}/status", jobs.get_status, methods=["GET"]),
        Route("/jobs/{id}/retry", jobs.retry_job, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_page, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(RequestContext, routes=routes),
            Middleware(Authenticate, tokens=settings.tokens),
            Middleware(
                LimitBody, limit=settings.max_body_bytes, timeout=settings.request_body_timeout
            ),
        ],
        exception_handlers={HTTPException: http_error},
    )
    # `/jobs/` is not `/jobs`: a 404, never a redirect.
    app.router.redirect_slashes = False
    app.state.engine = engine
    app.state.notifier = Notifier(engine)
    app.state.settings = settings
    app.state.shutting_down = False
    app.state.admission = Admission.of(settings)
    app.state.openapi = openapi.document(
        registered_types(),
        auth=bool(settings.tokens),
        default_max_attempts=settings.max_attempts,
        admission=app.state.admission is not None,
    )
    return app
