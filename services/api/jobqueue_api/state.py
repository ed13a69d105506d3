"""`AppState`: what the API process holds for its requests, set once by `create_app`, and
`state_of(app)`, the one way to read it.

Starlette's own `app.state` is an untyped bag that Starlette itself never reads; here
`app.state` is this `AppState` instead, so that every read is checked (a misspelt field is
a type error, not an AttributeError in production).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette

from jobcore.settings import ApiSettings
from jobqueue_api.admission import Admission
from jobqueue_api.catalog import TypeCatalog
from jobqueue_api.groups import SubmitGroups
from jobqueue_api.notify import Notifier
from jobqueue_api.waiters import Waiters

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer


@dataclass(frozen=True, slots=True)
class AppState:
    """`engine` (the app's pool), `settings`, `notifier` (the NOTIFYs that wake workers),
    `groups` (the submits sharing statements), `waiters` (the requests waiting for jobs to
    finish, and their listening connection), `admission` (None without MAX_PENDING),
    `tracer` (None with tracing off), `openapi` (the document `/openapi.json` serves),
    `types` (the types submits accept, and their defaults), and
    `shutting_down` (set by `app.shut_down` when a signal arrives)."""

    engine: AsyncEngine
    settings: ApiSettings
    notifier: Notifier
    groups: SubmitGroups
    waiters: Waiters
    admission: Admission | None
    tracer: Tracer | None
    openapi: dict[str, Any]
    types: TypeCatalog
    shutting_down: asyncio.Event


def state_of(app: Starlette) -> AppState:
    """The state `create_app` gave `app` (in a route: `state_of(request.app)`)."""
    found = app.state
    if not isinstance(found, AppState):
        raise TypeError(f"{app!r} was not made by jobqueue_api.app.create_app")
    return found
