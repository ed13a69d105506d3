"""Who may see the dashboard and act through it, per request: the sign-in check, the CSRF
secret a page's forms derive their token from, and the cookies that carry both (see
`session` for what they hold)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import Response

from jobqueue_api.state import state_of
from jobqueue_api.ui.session import (
    CSRF_COOKIE,
    CSRF_FIELD,
    SESSION_COOKIE,
    SESSION_SECONDS,
    csrf_matches,
    new_csrf_secret,
    valid_session,
)


def tokens(request: Request) -> list[str]:
    return state_of(request.app).settings.api_tokens


def root(request: Request) -> str:
    """Where the dashboard is mounted (`/ui`): links and the cookies' Path start there."""
    return str(request.scope.get("root_path", ""))


def is_signed_in(request: Request) -> bool:
    """Whether this request may see the pages: no API_TOKENS, or a valid session."""
    configured = tokens(request)
    if not configured:
        return True
    return valid_session(request.cookies.get(SESSION_COOKIE), configured, time.time())


def csrf_secret(request: Request) -> tuple[str, bool]:
    """The secret this browser's forms derive their CSRF token from, and whether it is new
    (to be set as the `jobqueue_csrf` cookie on the response)."""
    if tokens(request) and is_signed_in(request):
        return request.cookies[SESSION_COOKIE], False
    existing = request.cookies.get(CSRF_COOKIE)
    if existing and 20 <= len(existing) <= 100:
        return existing, False
    return new_csrf_secret(), True


def csrf_ok(request: Request, form: Mapping[str, object]) -> bool:
    """Whether the posted form carries the token of this browser's secret."""
    presented = form.get(CSRF_FIELD)
    secret, fresh = csrf_secret(request)
    return isinstance(presented, str) and not fresh and csrf_matches(presented, secret)


def _cookie(request: Request, response: Response, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=root(request) or "/",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )


def set_csrf_cookie(request: Request, response: Response, secret: str) -> None:
    # A browser session's secret: it lasts as long as a sign-in would.
    _cookie(request, response, CSRF_COOKIE, secret, SESSION_SECONDS)


def set_session(request: Request, response: Response, value: str) -> None:
    _cookie(request, response, SESSION_COOKIE, value, SESSION_SECONDS)
    # A new sign-in gets a fresh pre-sign-in secret too (one a page showed before is dropped).
    _cookie(request, response, CSRF_COOKIE, "", 0)


def clear_session(request: Request, response: Response) -> None:
    _cookie(request, response, SESSION_COOKIE, "", 0)
    _cookie(request, response, CSRF_COOKIE, "", 0)
