"""`Task`: what `@handler` returns. Still the handler (call it as the function it wraps), and
the way to create jobs of its type with its options as defaults:

    @handler("send_receipt", queue="mail", max_attempts=3)
    async def send_receipt(payload, ctx): ...

    send_receipt.submit({"order": 42})                 # over HTTP (jobcore.client)
    send_receipt.enqueue(conn, {"order": 42})          # in the caller's transaction

Both take the create fields of a request (`priority`, `delay`, `idempotency_key`, ...);
a field given wins over the handler's option, which wins over the global default.
Importing this module imports neither httpx nor SQLAlchemy: each call brings what it needs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload
from uuid import UUID

if TYPE_CHECKING:
    from jobcore.client import AsyncClient, Client, Job
    from jobcore.registry import HandlerOptions
    from jobcore.transactional import AsyncConnectionLike, SyncConnection

P = ParamSpec("P")
R = TypeVar("R")


class Task(Generic[P, R]):
    """A registered handler: `fn` (what calling the task calls), its job `type` and its
    `options` (`jobcore.registry.HandlerOptions`)."""

    def __init__(self, fn: Callable[P, R], job_type: str, options: HandlerOptions) -> None:
        self.fn = fn
        self.type = job_type
        self.options = options
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.type!r} of {getattr(self.fn, '__qualname__', self.fn)!r}>"

    def fields(self, fields: dict[str, Any]) -> dict[str, Any]:
        """`fields` with this handler's options for those it omits."""
        return {**self.options.fields(), **fields}

    @overload
    def submit(self, payload: Any = None, *, client: None = None, **fields: Any) -> Job: ...

    @overload
    def submit(self, payload: Any = None, *, client: Client, **fields: Any) -> Job: ...

    @overload
    def submit(
        self, payload: Any = None, *, client: AsyncClient, **fields: Any
    ) -> Coroutine[Any, Any, Job]: ...

    def submit(
        self, payload: Any = None, *, client: Client | AsyncClient | None = None, **fields: Any
    ) -> Job | Coroutine[Any, Any, Job]:
        """Submit a job of this type through the API; returns its record (a coroutine of it
        with an `AsyncClient`). Without `client`, a `Client()` of its own (JOBQUEUE_URL,
        JOBQUEUE_TOKEN) for this one call. Raises as `Client.submit` does."""
        fields = self.fields(fields)
        if client is not None:
            return client.submit(self.type, payload, **fields)
        from jobcore.client import Client

        with Client() as own:
            return own.submit(self.type, payload, **fields)

    @overload
    def enqueue(self, conn: SyncConnection, payload: Any = None, **fields: Any) -> UUID: ...

    @overload
    def enqueue(
        self, conn: AsyncConnectionLike, payload: Any = None, **fields: Any
    ) -> Coroutine[Any, Any, UUID]: ...

    def enqueue(self, conn: Any, payload: Any = None, **fields: Any) -> Any:
        """Write a job of this type in the transaction open on `conn` (the connection kinds of
        `jobcore.enqueue`); returns its id (a coroutine of it, for an async connection)."""
        from jobcore.transactional import enqueue

        return enqueue(conn, self.type, payload, **self.fields(fields))
