"""The client's typed errors: what the API answered (status, its `{"error"}` message, the
request id) or why no answer came, and the job concerned where there is one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobcore.errors import JobqueueError

if TYPE_CHECKING:
    from jobcore.client.records import Job


class ClientError(JobqueueError):
    """A call to the API did not succeed.

    `status` is the HTTP status (None when no answer came), `message` the API's error
    message, `job_id` the job the call was about (if any), `request_id` the API's
    `X-Request-ID` for its logs, `retry_after` the seconds the API asked to wait (429, 503).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        job_id: str | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.message = message
        self.status = status
        self.job_id = job_id
        self.request_id = request_id
        self.retry_after = retry_after
        super().__init__(message if status is None else f"{message} (HTTP {status})")


class Invalid(ClientError, ValueError):
    """The API refused the input (400: what `jobcore.InvalidRequest` is answered with; 413),
    or the client could not encode it (`status` None); nothing was written."""


class Unauthorized(ClientError):
    """The API wants a valid token (401): set JOBQUEUE_TOKEN or pass `token`."""


class NotFound(ClientError, LookupError):
    """No such job (404)."""


class Conflict(ClientError):
    """The job is not in a status the operation starts from, or the idempotency key is bound
    to a different request (409)."""


class RateLimited(ClientError):
    """Its queue is full (429, MAX_PENDING) and stayed full while the client retried."""


class Unavailable(ClientError):
    """The API could not be reached, or answered 503, on every try the client made."""


class WaitTimeout(ClientError, TimeoutError):
    """The job had not finished when the wait ended; `job` is its record as last seen."""

    def __init__(self, message: str, *, job: Job) -> None:
        super().__init__(message, job_id=job.id)
        self.job = job


# HTTP status -> the error it raises (any other failing status raises ClientError itself).
BY_STATUS: dict[int, type[ClientError]] = {
    400: Invalid,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: Invalid,
    429: RateLimited,
    503: Unavailable,
}


def error_for(
    status: int,
    body: Any,
    *,
    job_id: str | None = None,
    request_id: str | None = None,
    retry_after: float | None = None,
) -> ClientError:
    """The typed error for a failing answer, with the API's message (its `error` field)."""
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        message: str = body["error"]
    else:
        message = f"unexpected answer: {str(body)[:200]}" if body else "no error message"
    kind = BY_STATUS.get(status, ClientError)
    return kind(
        message, status=status, job_id=job_id, request_id=request_id, retry_after=retry_after
    )
