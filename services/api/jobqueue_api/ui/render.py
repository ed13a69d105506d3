"""Rendering the dashboard's pages: the Jinja2 templates (autoescaped: every value shown is
text, never markup), the context every page shares (where the dashboard is mounted, the
sign-in state, the CSRF token of its forms), and the filters that format values."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
import markupsafe
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.templating import Jinja2Templates

from jobcore.record import timestamp
from jobqueue_api.ui import access
from jobqueue_api.ui.session import CSRF_FIELD, csrf_token

HERE = Path(__file__).resolve().parent


@functools.cache
def templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=when, ago=ago, age=age, duration=duration, number=number, pretty=pretty)
    return Jinja2Templates(env=env)


def page(
    request: Request,
    name: str,
    context: Mapping[str, Any],
    status: int = 200,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """The page `name` (a template) for this request, with the context every page shares."""
    secret, fresh = access.csrf_secret(request)
    shared = {
        "root": access.root(request),
        "auth": bool(access.tokens(request)),
        "signed_in": access.is_signed_in(request),
        "csrf_field": CSRF_FIELD,
        "csrf_token": csrf_token(secret),
        "query": query,
        # What a page may leave out.
        "current": None,
        "notice": None,
        "error": None,
        "known_types": [],
    }
    response = templates().TemplateResponse(
        request, name, {**shared, **context}, status_code=status, headers=headers
    )
    if fresh:
        access.set_csrf_cookie(request, response, secret)
    return response


def error(
    request: Request, status: int, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    try:
        return page(request, "error.html", {"status": status, "message": message}, status, headers)
    except Exception:
        # Rendering failed too: the message alone, still text, still HTML.
        text = markupsafe.escape(message)
        return HTMLResponse(f"<!doctype html><title>{status}</title><p>{text}</p>", status)


def query(params: Mapping[str, object]) -> str:
    """A query string of the parameters given (empty and None ones left out)."""
    return urlencode({k: v for k, v in params.items() if v not in (None, "")})


# --- filters ---------------------------------------------------------------------------


def when(value: datetime | None) -> str:
    """A time as the API shows it (RFC 3339, UTC); an em dash for none."""
    return timestamp(value) or "—"


def ago(value: datetime | None, now: datetime | None = None) -> str:
    """A time relative to now, as every page shows times: "3 min ago", "in 5 s", "now"
    (the element's `title` holds `when`'s RFC 3339 value); an em dash for none."""
    if value is None:
        return "—"
    seconds = ((now or datetime.now(UTC)) - value).total_seconds()
    if abs(seconds) < 1:
        return "now"
    text = _span(abs(seconds))
    return f"{text} ago" if seconds > 0 else f"in {text}"


def _span(seconds: float) -> str:
    """Whole units, rounded down: 45 s, 12 min, 3 h, 2 d."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        # 48 h, not 2 d; 90 min, not 1 h: the larger unit once it is coarse enough.
        if seconds >= size * (2 if unit != "min" else 1):
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


def duration(seconds: float | None) -> str:
    """A duration in the unit `ago` uses, with a decimal under a minute: 0.4 s, 12 s, 5 min."""
    if seconds is None:
        return "—"
    if seconds < 10:
        return f"{max(seconds, 0.0):.1f} s"
    return _span(seconds)


def age(seconds: float) -> str:
    """A duration to read at a glance: 45s, 12m 05s, 3h 20m, 2d 4h."""
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.0f}s" if seconds >= 1 or seconds == 0 else f"{seconds:.1f}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def number(value: int) -> str:
    return f"{value:,}"


def pretty(value: Any) -> str:
    """JSON as the API returns it, indented for reading."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
