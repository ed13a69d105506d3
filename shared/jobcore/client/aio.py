"""`AsyncClient`: the API over HTTP for asyncio (httpx.AsyncClient); the same calls as
`Client` (`calls.Calls`'s flows), awaited."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar
from uuid import UUID

import httpx

from jobcore.client.calls import Calls, list_filters
from jobcore.client.calls import selection as _selection
from jobcore.client.records import Job, QueueDepth, Submitted
from jobcore.client.retries import Flow, Retries, Sleep
from jobcore.client.sync import http_args, settings

T = TypeVar("T")


class AsyncClient:
    """The jobqueue API for asyncio; arguments as `Client`'s. Use as an async context
    manager, or `await aclose()`."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        retries: Retries | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url, headers = settings(url, token)
        self._calls = Calls(retries or Retries(), self.url)
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _run(self, flow: Flow[T]) -> T:
        try:
            effect = next(flow)
            while True:
                outcome: Any = None
                if isinstance(effect, Sleep):
                    await asyncio.sleep(effect.seconds)
                else:
                    try:
                        outcome = await self._http.request(
                            effect.method, effect.path, **http_args(effect)
                        )
                    except httpx.TransportError as exc:
                        outcome = exc
                effect = flow.send(outcome)
        except StopIteration as done:
            result: T = done.value
            return result

    async def submit(
        self,
        type: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> Job:
        return await self._run(self._calls.submit(type, payload, idempotency_key, fields))

    async def submit_many(self, jobs: Iterable[Mapping[str, Any]]) -> builtins.list[Submitted]:
        return await self._run(self._calls.submit_many(jobs))

    async def get(self, job_id: str | UUID) -> Job:
        return await self._run(self._calls.get(job_id))

    async def wait(
        self,
        job_id: str | UUID,
        # Not asyncio.timeout's job: it sets the API's long polls, and the error raised says
        # how the job stood when the wait ended (WaitTimeout.job).
        timeout: float | None = None,  # noqa: ASYNC109
        *,
        progress: Callable[[Job], None] | None = None,
    ) -> Job:
        return await self._run(self._calls.wait(job_id, timeout, progress))

    async def retry(self, job_id: str | UUID) -> Job:
        return await self._run(self._calls.retry(job_id))

    async def cancel(self, job_id: str | UUID) -> Job:
        return await self._run(self._calls.cancel(job_id))

    async def list(
        self,
        status: str | Iterable[str] | None = None,
        type: str | None = None,
        queue: str | None = None,
        *,
        page_size: int = 100,
    ) -> AsyncIterator[Job]:
        """Every matching job, newest first: `async for job in client.list(...)`."""
        filters = list_filters(status, type, queue, page_size)
        cursor: str | None = None
        while True:
            page, cursor = await self._run(self._calls.list_page(filters, cursor))
            for job in page:
                yield job
            if cursor is None:
                return

    async def pause(self, queue: str) -> bool:
        """Pause `queue`: no worker claims from it within a second; submissions still land."""
        return await self._run(self._calls.set_paused(queue, True))

    async def resume(self, queue: str) -> bool:
        """Resume `queue`; returns False (not paused)."""
        return await self._run(self._calls.set_paused(queue, False))

    async def cancel_matching(
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
        return await self._run(self._calls.act_on_matching("cancel", selection))

    async def retry_matching(
        self,
        status: str | Sequence[str] | None = None,
        type: str | None = None,
        queue: str | None = None,
        ids: Sequence[str | UUID] | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """Retry the jobs matching the filter: the API's {"retried", "more"}."""
        selection = _selection(status, type, queue, ids, limit)
        return await self._run(self._calls.act_on_matching("retry", selection))

    async def queues(self) -> builtins.list[QueueDepth]:
        return await self._run(self._calls.queues())
