"""The handler registry: `@handler("type")` binds a job type to a function.

Both services call `load_handlers()` at startup: the API to check submitted
types, the worker to run them. Importing a module registers its handlers.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

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


Handler = Callable[[Any, JobContext], Awaitable[None] | None]
H = TypeVar("H", bound=Handler)

_registry: dict[str, Handler] = {}


def handler(job_type: str) -> Callable[[H], H]:
    """Register the decorated function (async or plain) as the handler of `job_type`."""
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
            raise ConfigError("JOB_HANDLERS", f"cannot import {name!r}: {exc}") from exc
