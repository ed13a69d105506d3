"""`Client`: the API over HTTP, blocking (httpx.Client). Its calls are `calls.Calls`'s flows."""

from __future__ import annotations

import builtins
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar
from uuid import UUID

import httpx

from jobcore.client.calls import Calls, list_filters
from jobcore.client.calls import selection as _selection
from jobcore.client.records import Job, QueueDepth, Submitted
from jobcore.client.retries import Flow, Request, Retries, Sleep

T = TypeVar("T")

DEFAULT_URL = "http://localhost:8080"
USER_AGENT = "jobqueue-client/0.1"


def settings(url: str | None, token: str | None) -> tuple[str, dict[str, str]]:
    """The base URL (`url`, else JOBQUEUE_URL, else DEFAULT_URL) and the headers every
    request carries (a bearer token from `token`, else JOBQUEUE_TOKEN)."""
    base = (url or os.environ.get("JOBQUEUE_URL") or DEFAULT_URL).rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"the API's URL must start with http:// or https://, got {base!r}")
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    secret = token if token is not None else os.environ.get("JOBQUEUE_TOKEN")
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    return base, headers


def http_args(request: Request) -> dict[str, Any]:
    """httpx's arguments for `request` (the same for the sync and async clients)."""
    args: dict[str, Any] = {"params": request.query(), "headers": dict(request.headers)}
    if request.body is not None:
        args["content"] = request.body
        args["headers"]["Content-Type"] = "application/json"
    if request.timeout is not None:
        args["timeout"] = request.timeout
    return args


class Client:
    """The jobqueue API, blocking. `url` defaults to JOBQUEUE_URL (else
    http://localhost:8080), `token` to JOBQUEUE_TOKEN; `timeout` bounds each request
    (a long poll gets its wait on top); `retries` says how calls retry connection
    errors, 429 and 503. Use as a context manager, or `close()` it."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        retries: Retries | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url, headers = settings(url, token)
        self._calls = Calls(retries or Retries(), self.url)
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _run(self, flow: Flow[T]) -> T:
        try:
            effect = next(flow)
            while True:
                outcome: Any = None
                if isinstance(effect, Sleep):
                    time.sleep(effect.seconds)
                else:
                    try:
                        outcome = self._http.request(
                            effect.method, effect.path, **http_args(effect)
                        )
                    except httpx.TransportError as exc:
                        outcome = exc
                effect = flow.send(outcome)
        except StopIteration as done:
            result: T = done.value
            return result

    def submit(
        self,
        type: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> Job:
        """Create a job (`fields`: max_attempts, queue, priority, run_at or delay, timeout,
        concurrency_key); with the key of an existing job of the same request, that job."""
        return self._run(self._calls.submit(type, payload, idempotency_key, fields))

    def submit_many(self, jobs: Iterable[Mapping[str, Any]]) -> builtins.list[Submitted]:
        """Create many jobs (create requests, each with an optional `idempotency_key`), in
        batches of 1,000; one result per job, in order."""
        return self._run(self._calls.submit_many(jobs))

    def get(self, job_id: str | UUID) -> Job:
        return self._run(self._calls.get(job_id))

    def wait(
        self,
        job_id: str | UUID,
        timeout: float | None = None,
        *,
        progress: Callable[[Job], None] | None = None,
    ) -> Job:
        """The job once it has finished (completed, failed, dead_letter or cancelled); raises
        WaitTimeout after `timeout` seconds (None: no limit). The timeout bounds the whole
        wait, retries of a broken long poll included (docs/client.md); when no answer at all
        came by then, Unavailable. `progress` is called with the record every couple of
        seconds while it runs."""
        return self._run(self._calls.wait(job_id, timeout, progress))

    def retry(self, job_id: str | UUID) -> Job:
        """Requeue a dead_letter, failed or cancelled job with a fresh attempt budget."""
        return self._run(self._calls.retry(job_id))

    def cancel(self, job_id: str | UUID) -> Job:
        """Cancel a pending or dead_letter job at once, or ask its worker to stop a
        processing one (the record then shows `cancel_requested_at`)."""
        return self._run(self._calls.cancel(job_id))

    def list(
        self,
        status: str | Iterable[str] | None = None,
        type: str | None = None,
        queue: str | None = None,
        *,
        page_size: int = 100,
    ) -> Iterator[Job]:
        """Every matching job, newest first, fetched a page at a time as you iterate."""
        filters = list_filters(status, type, queue, page_size)
        cursor: str | None = None
        while True:
            page, cursor = self._run(self._calls.list_page(filters, cursor))
            yield from page
            if cursor is None:
                return

    def pause(self, queue: str) -> bool:
        """Pause `queue`: no worker claims from it within a second; submissions still land."""
        return self._run(self._calls.set_paused(queue, True))

    def resume(self, queue: str) -> bool:
        """Resume `queue`; returns False (not paused)."""
        return self._run(self._calls.set_paused(queue, False))

    def cancel_matching(
        self,
        status: str | Sequence[str] | None = None,
        type: str | None = None,
        queue: str | None = None,
        ids: Sequence[str | UUID] | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """Cancel the jobs matching the filter (docs/api.md#bulk-actions): the API's
        {"cancelled", "cancel_requested", "more"}."""
        selection = _selection(status, type, queue, ids, limit)
        return self._run(self._calls.act_on_matching("cancel", selection))

    def retry_matching(
        self,
        status: str | Sequence[str] | None = None,
        type: str | None = None,
        queue: str | None = None,
        ids: Sequence[str | UUID] | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """Retry the jobs matching the filter: the API's {"retried", "more"}."""
        selection = _selection(status, type, queue, ids, limit)
        return self._run(self._calls.act_on_matching("retry", selection))

    def queues(self) -> builtins.list[QueueDepth]:
        return self._run(self._calls.queues())
