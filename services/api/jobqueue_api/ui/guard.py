"""What stands in front of every dashboard page: the security headers on every response
(errors, redirects and static files too), the sign-in every page but the sign-in form and
the static files requires when API_TOKENS is set, and errors shown as HTML pages (never a
traceback, and never a response without the headers)."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jobqueue_api.database import is_unavailable
from jobqueue_api.ui import access, render

log = logging.getLogger("jobqueue.api")

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'"
    ),
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
}
# Reachable without signing in: the form itself and the stylesheet and script it uses.
OPEN_PATHS = ("/sign-in",)
OPEN_PREFIXES = ("/static/",)


def route_path(scope: Scope) -> str:
    """The path below the dashboard's root (`/jobs` for `/ui/jobs`)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


class Guard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        static = path.startswith(OPEN_PREFIXES)
        started = False

        async def with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name.encode() not in names:
                        headers.append((name.encode(), value.encode()))
                if not static:
                    # Pages show live data, some of it sensitive: never from a cache.
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        request = Request(scope, receive)
        try:
            if request.method == "POST" and not _same_origin(request):
                await render.error(request, 403, "Refused: this form came from another site.")(
                    scope, receive, with_headers
                )
                return
            if not _open(path) and not access.is_signed_in(request):
                await _sign_in_first(request)(scope, receive, with_headers)
                return
            await self.app(scope, receive, with_headers)
        except Exception as exc:
            if started:
                raise
            response = _error_page(request, exc)
            await response(scope, receive, with_headers)


def _same_origin(request: Request) -> bool:
    """Whether a POST came from a page of this site, as far as the browser says (a request
    without these headers, from a script or an old browser, still needs its CSRF token).
    Defence in depth beside the CSRF token, whose secret a sibling site could set."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    # The pages' Referrer-Policy (no-referrer) makes browsers send `Origin: null` with their
    # own forms: only an origin that names another site refuses.
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return True
    return urlsplit(origin).netloc == request.headers.get("host", "")


def _sign_in_first(request: Request) -> Response:
    """A page asked for before signing in: to the form (coming back here after); an action:
    refused (a form posted from a page whose session has since ended)."""
    root = access.root(request)
    if request.method in ("GET", "HEAD"):
        back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"{root}/sign-in?{render.query({'next': back})}", status_code=303)
    return render.error(request, 401, "Sign in first: your session has ended or never began.")


def _error_page(request: Request, exc: Exception) -> Response:
    if isinstance(exc, HTTPException):
        if exc.status_code == 404:
            message = f"There is no page at {request.url.path}."
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed here."
        else:
            message = str(exc.detail)
        return render.error(request, exc.status_code, message, exc.headers)
    if is_unavailable(exc):
        log.warning("database unavailable (dashboard)")
        return render.error(
            request, 503, "The database is unavailable; try again shortly.", {"Retry-After": "1"}
        )
    log.error("unhandled error (dashboard)", exc_info=exc)
    return render.error(request, 500, "Internal error: see the API's log.")
