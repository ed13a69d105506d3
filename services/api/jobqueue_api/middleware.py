"""Pure ASGI middleware, outermost first: request context, authentication, body limits.

`RequestContext` gives every request an id (on the response and on every log
line), writes the access log line and the duration metric, and turns any
exception into a JSON error, so no traceback ever reaches a client.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import time
import uuid
from collections.abc import Sequence

from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jobcore import logs
from jobcore.errors import JobqueueError
from jobqueue_api import metrics
from jobqueue_api.errors import BodyTooLarge, error_response, response_for

log = logging.getLogger("jobqueue.api.access")
_NO_FIELDS = logs.Fields()

# The status logged (never sent) when the client disconnects mid-request, as nginx does.
CLIENT_CLOSED = 499

# A caller's id is echoed only if it cannot forge or break a log line.
_SANE_ID = re.compile(rb"[A-Za-z0-9._:+/=@-]{1,128}")


def _header(scope: Scope, name: bytes) -> list[bytes]:
    return [value for key, value in scope["headers"] if key == name]


def request_id(scope: Scope) -> str:
    values = _header(scope, b"x-request-id")
    if len(values) == 1 and _SANE_ID.fullmatch(values[0]):
        return values[0].decode("ascii")
    return uuid.uuid4().hex


def route_template(routes: Sequence[BaseRoute], scope: Scope) -> str:
    """The path template that matched (`/jobs/{id}`), so metrics never label raw paths."""
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return str(getattr(route, "path", "unmatched"))
        if match is Match.PARTIAL and partial is None:
            partial = str(getattr(route, "path", "unmatched"))
    return partial or "unmatched"


class RequestContext:
    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes
        self._paths = {id(route): str(getattr(route, "path", "unmatched")) for route in routes}

    def _route(self, scope: Scope) -> str:
        """`route_template`, read off the route the router chose when it was one of ours."""
        path = self._paths.get(id(scope.get("route")))
        return path if path is not None else route_template(self.routes, scope)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        rid = request_id(scope)
        status = 500
        response_started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                status = message["status"]
                response_started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"x-request-id"]
                headers.append((b"x-request-id", rid.encode("ascii")))
                message = {**message, "headers": headers}
            await send(message)

        with logs.bind(request_id=rid):
            try:
                await self.app(scope, receive, send_with_id)
            except ClientDisconnect:
                # The client went away before the answer: nothing to send, nothing wrong.
                status = CLIENT_CLOSED
            except Exception as exc:
                if response_started:
                    log.error("error after the response started", exc_info=exc)
                    raise
                await response_for(exc)(scope, receive, send_with_id)
            finally:
                seconds = time.perf_counter() - started
                # The line `log.info("request", extra=...)` writes, without its LogRecord.
                logs.line(
                    log,
                    "request",
                    _NO_FIELDS,
                    {
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": status,
                        "duration_ms": round(seconds * 1000, 3),
                    },
                )
                metrics.observe_request(scope["method"], self._route(scope), status, seconds)


# What API_TOKENS protects: every path under these (health, metrics and the document stay open).
PROTECTED = ("/jobs", "/queues")


def protected(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in PROTECTED)


def token_matches(presented: bytes, tokens: Sequence[bytes]) -> bool:
    """Whether `presented` is one of `tokens` (a bearer token here, the dashboard's sign-in)."""
    # Compare with every token, so timing reveals neither a token nor which one matched.
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(presented, token)
    return matched


class Authenticate:
    """`/jobs...` and `/queues` require `Authorization: Bearer <token>` when API_TOKENS is set."""

    def __init__(self, app: ASGIApp, tokens: Sequence[str]) -> None:
        self.app = app
        self.tokens = [token.encode("utf-8") for token in tokens]

    def _authorized(self, scope: Scope) -> bool:
        values = _header(scope, b"authorization")
        if len(values) != 1:
            return False
        scheme, _, presented = values[0].partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return token_matches(presented.strip(), self.tokens)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        locked = scope["type"] == "http" and protected(path)
        if self.tokens and locked and not self._authorized(scope):
            response = error_response(
                401, "missing or invalid bearer token", {"WWW-Authenticate": "Bearer"}
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class BodyTimeout(JobqueueError):
    """The request body did not arrive within REQUEST_BODY_TIMEOUT (`timeout`, seconds)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        super().__init__(f"request body not received within {timeout:g}s")


class LimitBody:
    """Refuses bodies over `limit` bytes: up front by Content-Length, else while reading,
    so an oversized body is never held in memory. A body still incomplete `timeout`
    seconds after the request started is answered 408 and its connection closed: a
    client trickling a byte at a time would otherwise hold the connection for ever."""

    def __init__(self, app: ASGIApp, limit: int, timeout: float) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for value in _header(scope, b"content-length"):
            if value.strip().isdigit() and int(value) > self.limit:
                await response_for(BodyTooLarge(self.limit))(scope, receive, send)
                return
        received = 0
        complete = False
        deadline = asyncio.get_running_loop().time() + self.timeout
        response_started = False

        async def limited_receive() -> Message:
            nonlocal received, complete
            if complete:  # later calls wait for a disconnect, which may take any time
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout(self.timeout) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
                complete = not message.get("more_body", False)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            response_started = response_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTimeout as exc:
            if response_started:
                raise
            # The rest of the body is never read, so the connection cannot be reused.
            await error_response(408, str(exc), {"Connection": "close"})(scope, receive, send)
