"""`HotRoute`: `POST /jobs`, the API's busiest route, served ahead of Starlette's router.

It is the innermost middleware, so a submit still passes through every layer the other
routes pass through (request id, access log and metrics, tracing, the bearer token, the
body limits) and answers exactly as through the router; what it skips is the router's
matching, Starlette's exception layer and its Request object, about a tenth of the API's
CPU per submit (docs/performance.md#api-submit). Every other request goes on to the router.
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from jobqueue_api import jobs


class HotRoute:
    def __init__(self, app: ASGIApp, route: BaseRoute) -> None:
        """`route`: the router's `/jobs` route, put in the scope as the router would, so the
        access log and the metrics name the route the same either way."""
        self.app = app
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/jobs" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        scope["route"] = self.route
        body = await read_body(receive)
        response = await jobs.submit_one(scope["app"].state, scope["headers"], body)
        await response(scope, receive, send)


async def read_body(receive: Receive) -> bytes:
    """The whole request body (as `Request.body()` reads it); ClientDisconnect if the client
    leaves first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
