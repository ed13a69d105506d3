"""The threads that run plain `def` handlers: a call never waits for a thread.

A call goes to an idle thread, or to a new one when none is idle, so a handler
starts as soon as its attempt does and JOB_TIMEOUT measures the handler alone.
A thread cannot be interrupted: when its attempt ends without it (timeout,
shutdown) the awaiting future is cancelled and the thread is abandoned to run
on; the next call simply gets another thread, so abandoned threads never take
capacity away. When an abandoned call finally returns, `late_return(key)` is
called on the event loop. At most `keep` idle threads wait for work; the others end.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any

_Item = tuple[Callable[[], Any], "asyncio.Future[Any]", asyncio.AbstractEventLoop, object]


class HandlerThreads:
    def __init__(self, keep: int, late_return: Callable[[object], None]) -> None:
        self._keep = keep
        self._late_return = late_return
        # Idle threads. list.pop and list.append are atomic: the loop takes, threads give back.
        self._idle: list[_Thread] = []
        self._started = 0
        self._closed = False

    @property
    def started(self) -> int:
        """Threads started so far (a test's view of how many were ever needed)."""
        return self._started

    def submit(self, fn: Callable[[], Any], key: object) -> asyncio.Future[Any]:
        """Run `fn()` in a thread now; the future gets its result (cancel it to abandon)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        try:
            thread = self._idle.pop()
        except IndexError:
            self._started += 1
            thread = _Thread(self, f"handler-{self._started}")
            thread.start()
        thread.work.put((fn, future, loop, key))
        return future

    def close(self) -> None:
        """Let idle threads end; busy (abandoned) ones end when their call returns."""
        self._closed = True
        while self._idle:
            try:
                self._idle.pop().work.put(None)
            except IndexError:
                break

    def _deliver(self, future: asyncio.Future[Any], result: Any, error: Any, key: object) -> None:
        if future.cancelled():
            self._late_return(key)
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def _idle_again(self, thread: _Thread) -> bool:
        if self._closed or len(self._idle) >= self._keep:
            return False
        self._idle.append(thread)
        return True


class _Thread(threading.Thread):
    def __init__(self, owner: HandlerThreads, name: str) -> None:
        # Daemon: a handler that never returns must not hold the process's exit.
        super().__init__(name=name, daemon=True)
        self.owner = owner
        self.work: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            item = self.work.get()
            if item is None:
                return
            fn, future, loop, key = item
            del item
            result = error = None
            try:
                result = fn()
            except BaseException as exc:  # delivered to the attempt, which decides
                error = exc
            del fn
            try:
                loop.call_soon_threadsafe(self.owner._deliver, future, result, error, key)
            except RuntimeError:
                return  # the loop is closed: the process is on its way out
            del future, result, error, key
            if not self.owner._idle_again(self):
                return
