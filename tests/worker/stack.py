"""A worker process's dispatcher, executor and completer over a `FakeStore`, wired as
`jobqueue_worker.child` wires them, for unit tests."""

from __future__ import annotations

import asyncio
from typing import Any

from jobqueue_worker.completer import Completer
from jobqueue_worker.dispatcher import Dispatcher
from jobqueue_worker.executor import Executor
from tests.worker.fakestore import FakeStore


class Stack:
    def __init__(
        self,
        store: FakeStore,
        *,
        slots: int | dict[str, int] = 3,
        poll_interval: float = 0.05,
        lease_seconds: float = 60.0,
        job_timeout: float = 5.0,
        backoff_base: float = 1.0,
        backoff_max: float = 60.0,
        cancel_grace: float = 0.2,
        max_result_bytes: int = 65_536,
        tracer: Any = None,
        **completer: Any,
    ) -> None:
        self.store = store
        per_queue = {"default": slots} if isinstance(slots, int) else slots
        batch_size = completer.pop("batch_size", sum(per_queue.values()))
        self.completer = Completer(store, batch_size=batch_size, **completer)
        self.executor = Executor(
            self.completer.add,
            slots=per_queue,
            job_timeout=job_timeout,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            cancel_grace=cancel_grace,
            max_result_bytes=max_result_bytes,
            tracer=tracer,
        )
        self.dispatcher = Dispatcher(
            store, self.executor, poll_interval=poll_interval, lease_seconds=lease_seconds
        )
        self.executor.on_slot_freed = self.dispatcher.slot_freed
        self.completer.claimer = self.dispatcher
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Stack:
        self._tasks = [
            asyncio.create_task(self.completer.run()),
            asyncio.create_task(self.dispatcher.run()),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown(0.0)

    async def shutdown(self, shutdown_timeout: float) -> None:
        """The child's shutdown sequence: stop claiming, drain the slots, flush the completer."""
        if not self._tasks:
            return
        completer_task, dispatcher_task = self._tasks
        self._tasks = []
        self.dispatcher.stop()
        await dispatcher_task
        await self.executor.shutdown(shutdown_timeout)
        self.completer.close()
        await completer_task
