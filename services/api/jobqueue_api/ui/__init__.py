"""The dashboard at `/ui/` (docs/api.md, "Dashboard"): server-rendered pages of the queues,
the jobs, the dead letters and the periodic schedules, with the retry and cancel actions,
readable without JavaScript. `routes()` is what the app mounts."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route, Router
from starlette.staticfiles import StaticFiles

from jobqueue_api.ui import actions, pages
from jobqueue_api.ui.guard import SECURITY_HEADERS, Guard
from jobqueue_api.ui.render import HERE

ROOT = "/ui"


async def _home(request: Request) -> Response:
    """`/ui` is `/ui/`."""
    root = str(request.scope.get("root_path", ""))
    headers = {**SECURITY_HEADERS, "cache-control": "no-store"}
    return RedirectResponse(f"{root}{ROOT}/", status_code=308, headers=headers)


async def _sign_in(request: Request) -> Response:
    if request.method == "POST":
        return await actions.sign_in(request)
    return await pages.sign_in_page(request)


def routes() -> list[BaseRoute]:
    inner = Router(
        routes=[
            Route("/", pages.queues, methods=["GET"]),
            Route("/jobs", pages.jobs_page, methods=["GET"]),
            Route("/jobs/bulk", actions.bulk_action, methods=["POST"]),
            Route("/jobs/{id}", pages.job_page, methods=["GET"]),
            Route("/jobs/{id}/retry", actions.retry, methods=["POST"]),
            Route("/jobs/{id}/cancel", actions.cancel, methods=["POST"]),
            Route("/dead-letters", pages.dead_letters, methods=["GET"]),
            Route("/dead-letters/retry", actions.retry_dead_letters, methods=["POST"]),
            Route("/schedules", pages.schedules_page, methods=["GET"]),
            Route("/queues/{queue}/pause", actions.pause, methods=["POST"]),
            Route("/queues/{queue}/resume", actions.resume, methods=["POST"]),
            Route("/sign-in", _sign_in, methods=["GET", "POST"]),
            Route("/sign-out", actions.sign_out, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static")),
        ],
        redirect_slashes=False,
    )
    # Every method: a 308 keeps it, so what /ui/ says of it (a 405) carries the headers.
    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    return [Route(ROOT, _home, methods=methods), Mount(ROOT, app=Guard(inner))]
