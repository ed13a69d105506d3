"""The shape of every background loop of the worker: recovery, the wake-up listener, and
the loops to come.

A loop validates its settings when it is made, does one round of work in
`run_once()` (which tests call directly), and `run(stop)` repeats it every
`interval` seconds until `stop` is set; `nudge()` starts the next round at once. A
round that raises is logged once per run of failures and retried after the waits of a
`jobcore.backoff.Retry`, never in a busy loop; the first success after failures is
logged too.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging

from jobcore.backoff import Retry
from jobcore.errors import describe

log = logging.getLogger("jobqueue.worker")


class Loop(abc.ABC):
    """A background loop; subclasses implement `run_once()`."""

    name = "loop"

    def __init__(self, interval: float, retry: Retry) -> None:
        if interval <= 0:
            raise ValueError(f"{self.name}: interval must be positive, got {interval}")
        self.interval = interval
        self.retry = retry
        self._nudged = asyncio.Event()

    def nudge(self) -> None:
        """Run the next round now instead of at the end of the current wait."""
        self._nudged.set()

    @abc.abstractmethod
    async def run_once(self) -> object:
        """One round of the loop's work; what it returns is for tests and callers."""

    def failed(self, exc: Exception) -> None:
        """Called with the error of the first round of a run of failures."""
        log.warning("loop failing", extra={"loop": self.name, "error": describe(exc)})

    def recovered(self) -> None:
        """Called on the first success after failures."""
        log.info("loop recovered", extra={"loop": self.name})

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._nudged.clear()  # a nudge during the round still cuts the wait after it
            try:
                await self.run_once()
            except Exception as exc:
                if self.retry.failures == 0:
                    self.failed(exc)
                else:
                    log.debug("loop still failing", extra={"loop": self.name}, exc_info=True)
                wait = self.retry.failed()
            else:
                if self.retry.failures:
                    self.recovered()
                self.retry.succeeded()
                wait = self.interval
            await self._pause(stop, wait)

    async def _pause(self, stop: asyncio.Event, seconds: float) -> None:
        if self._nudged.is_set():
            await asyncio.sleep(0)  # still a turn for the rest of the event loop
            return
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._nudged.wait())]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()


async def sleep_until(stop: asyncio.Event, seconds: float) -> bool:
    """Wait up to `seconds` for `stop`; True if it is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
    return stop.is_set()
