"""Every error the API answers with is `{"error": "..."}`: these build them."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from jobcore.errors import POOLER_HINT, JobqueueError, describe, pooled_statements_lost
from jobqueue_api.database import is_unavailable
from jobqueue_api.records import JSONBody

log = logging.getLogger("jobqueue.api")


class BodyTooLarge(JobqueueError):
    """The request body exceeds MAX_BODY_BYTES (raised while it is being read)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"request body is larger than MAX_BODY_BYTES ({limit} bytes)")


def error_response(
    status: int, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONBody({"error": message}, status_code=status, headers=headers)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no such resource: {request.url.path}"
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        message = f"method {request.method} is not allowed on {request.url.path}"
        message += f" (allowed: {allowed})" if allowed else ""
    else:
        message = exc.detail
    return error_response(exc.status_code, message, exc.headers)


def response_for(exc: Exception) -> JSONResponse:
    """The answer to an exception no route handled: 413, 503 for a database outage, else 500."""
    if isinstance(exc, BodyTooLarge):
        # The rest of the body is never read, so the connection cannot be reused.
        return error_response(413, str(exc), {"Connection": "close"})
    if pooled_statements_lost(exc):
        # The deployment's to fix (describe() says how), not a bug of the request's.
        log.error("database unusable through its pooler: %s (%s)", _first_line(exc), POOLER_HINT)
        return error_response(503, "database unusable through its pooler")
    if is_unavailable(exc):
        log.warning("database unavailable: %s", _first_line(exc))
        return error_response(503, "database unavailable", {"Retry-After": "1"})
    log.error("unhandled error", exc_info=exc)
    return error_response(500, "internal error")


def _first_line(exc: BaseException) -> str:
    return describe(exc).splitlines()[0][:300]
