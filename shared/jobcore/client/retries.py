"""How a call reaches the API: one request, tried again on connection errors, 429 and 503,
with capped exponential backoff and jitter (`jobcore.backoff`), never sooner than the API's
`Retry-After`, within a bounded number of tries and seconds.

A call may also have a deadline (`wait`'s timeout): no try starts, and no backoff runs,
past it, and each try is cut to the time left (see `Request.within`).

Written without I/O, as generators (`Flow`) that yield what they need done: a `Request` to
send (answered with the httpx response, or the httpx transport error) or a `Sleep`. The
sync and async clients run the same flows, each with its own I/O.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx

from jobcore.backoff import backoff
from jobcore.client.errors import Unavailable, error_for
from jobcore.errors import JobqueueError, describe

T = TypeVar("T")


# The shortest long poll (`?wait=` is sent to the millisecond and must be above 0): a call
# with less time left than this before its deadline has run out of time.
LEAST = 0.001
# Seconds allowed past a call's deadline for the answer of the try that ends at it: a long
# poll that the API holds until the deadline answers only then.
ANSWER_GRACE = 0.25


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    params: Mapping[str, str] | None = None
    body: bytes | None = None  # JSON
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = None  # seconds to wait for the answer; None: the client's
    wait: float | None = None  # a long poll: the API holds its answer up to this (`?wait=`)

    def within(self, left: float) -> Request:
        """This request cut to the `left` seconds its call has: a long poll held no longer,
        its answer awaited at most ANSWER_GRACE beyond (each of httpx's timeouts)."""
        limit = left + ANSWER_GRACE
        return replace(
            self,
            wait=None if self.wait is None else max(min(self.wait, left), LEAST),
            timeout=limit if self.timeout is None else min(self.timeout, limit),
        )

    def query(self) -> dict[str, str]:
        """The query parameters, the long poll's `wait` (seconds, to the millisecond) among
        them."""
        params = dict(self.params or {})
        if self.wait is not None:
            params["wait"] = f"{self.wait:.3f}"
        return params


@dataclass(frozen=True)
class Sleep:
    seconds: float


Effect = Request | Sleep
Flow = Generator[Effect, Any, T]


@dataclass(frozen=True)
class Retries:
    """How hard a call tries: at most `attempts` tries (the first included) within `total`
    seconds, waiting `backoff(n, base, cap)` after the n-th failure, or longer when the API
    asks (`Retry-After`). A wait that would end past `total` is not started."""

    attempts: int = 5
    total: float = 30.0
    base: float = 0.2
    cap: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.total < 0 or not 0 < self.base <= self.cap:
            raise ValueError(f"invalid retries: {self}")

    def wait(self, failures: int, retry_after: float | None, started: float) -> float | None:
        """Seconds to wait before the next try after `failures` failed ones; None: give up."""
        if failures >= self.attempts:
            return None
        seconds = backoff(failures, self.base, self.cap)
        if retry_after is not None:
            seconds = max(seconds, retry_after)
        if time.monotonic() - started + seconds > self.total:
            return None
        return seconds


class OutOfTime(JobqueueError):
    """A call's deadline came before it succeeded; `error` is what it would fail with
    otherwise (the last try's: Unavailable, or the error a 429 or 503 stands for)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # the JSON document; the text (None if empty) when the body was not JSON
    headers: httpx.Headers
    # An earlier try may have been applied although its answer was lost (the connection
    # broke after the request was sent, or the API answered 503).
    after_lost: bool

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def error(self, job_id: str | None = None) -> Exception:
        return error_for(
            self.status,
            self.body,
            job_id=job_id,
            request_id=self.headers.get("x-request-id"),
            retry_after=retry_after(self.headers.get("retry-after")),
        )


def retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """`Retry-After` in seconds: a number of seconds, or an HTTP date (none: None)."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


# Errors after which a new try may succeed. The others (an unsupported URL scheme, a
# request httpx itself refuses) fail the same way every time.
RETRYABLE = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
# Raised before any byte of the request was sent: the API cannot have acted on it.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def _body(response: httpx.Response) -> Any:
    """The JSON document; the text when the body is not JSON (a proxy's error page)."""
    try:
        return response.json()
    except ValueError:
        return response.text or None


def send(
    request: Request,
    retries: Retries,
    base_url: str,
    *,
    repeatable: bool = True,
    deadline: float | None = None,
) -> Flow[Answer]:
    """Send `request` until it gets an answer other than 429 or 503, or `retries` runs out.

    Returns the last answer (429 and 503 included, once retries ran out); raises
    Unavailable when the last try got no answer. A request that is not `repeatable` is sent
    again only when the API cannot have acted on it (the connection failed before it was
    sent, or a 429): after any other failure, Unavailable says it may have been applied.
    The time allowed (`Retries.total`) counts from the first failure, so a long poll that
    failed late is tried again too.

    With a `deadline` (a `time.monotonic()` time), each try is cut to the time left
    (`Request.within`) and a backoff to it; once it has come, OutOfTime instead of another
    try.
    """
    started = 0.0
    failures = 0
    lost = False
    error: Exception | None = None  # what the call fails with if its time runs out now
    while True:
        attempt = request
        if deadline is not None:
            left = deadline - time.monotonic()
            if error is not None and left < LEAST:
                raise OutOfTime(error)
            attempt = request.within(max(left, LEAST))
        outcome = yield attempt
        if failures == 0:
            started = time.monotonic()
        if isinstance(outcome, httpx.TransportError):
            failures += 1
            if not isinstance(outcome, RETRYABLE):
                raise Unavailable(f"cannot call {base_url}: {describe(outcome)}") from outcome
            lost = lost or not isinstance(outcome, NOT_SENT)
            if lost and not repeatable:
                raise Unavailable(
                    f"{request.method} {request.path} may or may not have been applied: the "
                    f"connection to {base_url} broke after it was sent ({describe(outcome)}); "
                    "read the job before trying again"
                ) from outcome
            seconds = retries.wait(failures, None, started)
            if seconds is None:
                raise Unavailable(
                    f"cannot reach {base_url} ({failures} tries): {describe(outcome)}"
                ) from outcome
            error = Unavailable(
                f"cannot reach {base_url} in the time allowed ({failures} tries): "
                f"{describe(outcome)}"
            )
            error.__cause__ = outcome
            yield Sleep(_until(seconds, deadline))
            continue
        response: httpx.Response = outcome
        answer = Answer(response.status_code, _body(response), response.headers, lost)
        if answer.status == 503 and not repeatable:
            return answer
        if answer.status in (429, 503):
            failures += 1
            seconds = retries.wait(
                failures, retry_after(response.headers.get("retry-after")), started
            )
            if seconds is not None:
                lost = lost or answer.status == 503
                error = answer.error()
                yield Sleep(_until(seconds, deadline))
                continue
        return answer


def _until(seconds: float, deadline: float | None) -> float:
    """`seconds`, cut so as to end by `deadline` (None: not cut)."""
    if deadline is None:
        return seconds
    return max(min(seconds, deadline - time.monotonic()), 0.0)
