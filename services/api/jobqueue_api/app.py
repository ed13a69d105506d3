"""`create_app(settings, engine)`: the Starlette application with its routes and middleware.

The process-level state the app reads is one `state.AppState`, read through
`state.state_of(app)`. `shut_down(app)` marks it shutting down; `close(app)` releases what
the app holds besides the engine.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from jobcore.db import probe_writable
from jobcore.errors import ReadOnlyServer
from jobcore.registry import registered_types
from jobcore.settings import ApiSettings
from jobqueue_api import flow, jobs, listing, metrics, openapi, ui
from jobqueue_api.admission import Admission
from jobqueue_api.catalog import TypeCatalog
from jobqueue_api.errors import error_response, http_error
from jobqueue_api.groups import SubmitGroups
from jobqueue_api.hot import HotRoute
from jobqueue_api.middleware import Authenticate, LimitBody, RequestContext
from jobqueue_api.notify import Notifier
from jobqueue_api.state import AppState, state_of
from jobqueue_api.tracing import TraceRequests
from jobqueue_api.waiters import Waiters

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

# Readiness must answer well before a prober's own timeout (often 1 s to a few).
READY_TIMEOUT = 2.0


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


def _notifications(waiters: Waiters) -> dict[str, str]:
    # Not a reason to be unready: a wait reads its job by polling meanwhile. Asked for, the
    # listener starts (if no wait started it): the check it runs is what readiness shows.
    waiters.start()
    check = waiters.notifications
    return {} if check is None else {"notifications": check.state}


async def readyz(request: Request) -> Response:
    state = state_of(request.app)
    if state.shutting_down.is_set():
        return error_response(503, "shutting down")
    try:
        # Writable, not merely answering: a standby the URL let it reach cannot serve.
        async with asyncio.timeout(READY_TIMEOUT):
            await probe_writable(state.engine)
    except ReadOnlyServer:
        return error_response(503, "database read-only")
    except Exception:  # any failure means "not ready"; the reason is in the access log status
        return error_response(503, "database unavailable")
    return JSONResponse({"status": "ready", **_notifications(state.waiters)})


async def metrics_page(request: Request) -> Response:
    body, content_type = metrics.render()
    return Response(body, media_type=content_type)


async def openapi_json(request: Request) -> Response:
    return JSONResponse(state_of(request.app).openapi)


async def jobs_collection(request: Request) -> Response:
    """`/jobs` is one route (so a 405 lists both methods): POST submits (served ahead of the
    router by `HotRoute`), GET lists."""
    if request.method == "POST":
        return await jobs.create_job(request)
    return await listing.list_jobs(request)


def create_app(
    settings: ApiSettings, engine: AsyncEngine, tracer: Tracer | None = None
) -> Starlette:
    """The app; `tracer` (from `jobcore.tracing.start`) traces requests and submits."""
    collection = Route("/jobs", jobs_collection, methods=["GET", "POST"])
    routes = [
        collection,
        Route("/jobs/batch", jobs.create_many, methods=["POST"]),
        Route("/jobs/cancel", flow.cancel_jobs, methods=["POST"]),
        Route("/jobs/retry", flow.retry_jobs, methods=["POST"]),
        Route("/jobs/{id}", jobs.get_job, methods=["GET"]),
        Route("/jobs/{id}/status", jobs.get_status, methods=["GET"]),
        Route("/jobs/{id}/retry", jobs.retry_job, methods=["POST"]),
        Route("/jobs/{id}/cancel", jobs.cancel_job, methods=["POST"]),
        Route("/queues", listing.queues, methods=["GET"]),
        Route("/queues/{queue}/pause", flow.pause_queue, methods=["POST"]),
        Route("/queues/{queue}/resume", flow.resume_queue, methods=["POST"]),
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
            *(
                [Middleware(Authenticate, tokens=settings.api_tokens)]
                if settings.api_tokens
                else []
            ),
            Middleware(
                LimitBody, limit=settings.max_body_bytes, timeout=settings.request_body_timeout
            ),
            Middleware(HotRoute, route=collection),
        ],
        exception_handlers={HTTPException: http_error},
    )
    # `/jobs/` is not `/jobs`: a 404, never a redirect.
    app.router.redirect_slashes = False
    notifier = Notifier(engine)
    admission = Admission.of(settings)
    document = openapi.document(
        sorted({*registered_types(), *settings.job_types}),
        auth=bool(settings.api_tokens),
        default_max_attempts=settings.max_attempts,
        admission=admission is not None,
    )
    # Set once, here; read through `state_of` (Starlette types `app.state` as its own bag).
    app.state = AppState(  # type: ignore[assignment]
        engine=engine,
        settings=settings,
        notifier=notifier,
        groups=SubmitGroups(engine, notifier),
        waiters=Waiters(settings.listen_url, engine),
        admission=admission,
        tracer=tracer,
        openapi=document,
        types=TypeCatalog(engine, settings.job_types),
        shutting_down=asyncio.Event(),
    )
    return app


def shut_down(app: Starlette) -> None:
    """A shutdown begins: /readyz answers 503, and waiting requests are answered now with
    their job as it is (a wait must not hold the shutdown; the client asks again, of a
    process that is not stopping)."""
    state = state_of(app)
    state.shutting_down.set()
    state.waiters.release()


async def close(app: Starlette) -> None:
    """Answer the waiters, close their listening connection, let the submit groups and a
    NOTIFY in flight end."""
    state = state_of(app)
    await state.waiters.close()
    await state.groups.close()
    await state.notifier.close()
