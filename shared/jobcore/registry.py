"""The handler registry: `@handler("type")` binds a job type to a function.

Both services call `load_handlers()` at startup: the API to check submitted
types, the worker to run them. Importing a module registers its handlers.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar
from uuid import UUID

from jobcore.environ import variable
from jobcore.errors import ConfigError

BUILTIN_MODULES = ("jobcore.builtin.sleep", "jobcore.builtin.webhook")


@dataclass(frozen=True)
class JobContext:
    """What a handler knows about the attempt it runs."""

    job_id: UUID
    type: str
    attempt: int
    max_attempts: int
    # The claim's fencing token: it grows with every claim of this job, so a
    # downstream system can reject a write from an attempt that lost its lease.
    lease_token: int = 0
    # Settings a built-in handler may need; kept here so handlers stay pure functions.
    webhook_allow_private: bool = False

    # Made on first use, not with the context: most handlers never look, and an Event costs
    # twice what the rest of the context does on the worker's hot path.
    _event: ClassVar[threading.Event | None] = None
    _stopped: ClassVar[bool] = False

    @property
    def cancelled(self) -> threading.Event:
        """Set when the attempt is being stopped: its cancel was requested, it timed out,
        the worker is shutting down, or its lease was lost. A plain `def` handler, which
        cannot be interrupted, should poll it (`ctx.cancelled.is_set()`, or wait on it
        instead of sleeping) and return soon after; an `async def` one is also cancelled."""
        event = self._event
        if event is None:
            with _lazy:
                event = self._event
                if event is None:
                    event = threading.Event()
                    if self._stopped:
                        event.set()
                    object.__setattr__(self, "_event", event)
        return event

    def stop(self) -> None:
        """Set `cancelled` (the executor calls this when it stops the attempt)."""
        with _lazy:
            object.__setattr__(self, "_stopped", True)
            event = self._event
        if event is not None:
            event.set()


# Guards the first use of `JobContext.cancelled` against `stop()` from another thread.
_lazy = threading.Lock()

# Returns (or, `async def`, returns from its coroutine) the job's result: JSON-serialisable,
# None for none.
Handler = Callable[[Any, JobContext], Any]
H = TypeVar("H", bound=Handler)

_registry: dict[str, Handler] = {}


def handler(job_type: str) -> Callable[[H], H]:
    """Register the decorated function (async or plain) as the handler of `job_type`. What it
    returns is the job's result: JSON-serialisable, None for none."""
    if not job_type or not job_type.strip():
        raise ValueError("a handler type must be a non-empty string")

    def register(fn: H) -> H:
        existing = _registry.get(job_type)
        if existing is not None and existing is not fn:
            raise ValueError(f"handler type {job_type!r} is already registered by {existing!r}")
        _registry[job_type] = fn
        return fn

    return register


def get_handler(job_type: str) -> Handler | None:
    return _registry.get(job_type)


def registered_types() -> list[str]:
    return sorted(_registry)


def load_handlers(modules: list[str]) -> None:
    """Import the built-in handlers and every module named in JOB_HANDLERS."""
    for name in BUILTIN_MODULES:
        importlib.import_module(name)
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any import failure is a configuration error
            raise ConfigError(variable("JOB_HANDLERS"), f"cannot import {name!r}: {exc}") from exc
