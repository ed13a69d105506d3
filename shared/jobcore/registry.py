"""The handler registry: `@handler("type", queue=..., ...)` binds a job type to a function
and to the defaults of its jobs' create fields, and returns a `jobcore.task.Task`.

The worker calls `load_handlers()` at startup to run the types it serves (and records them
in the database, `jobqueue_worker.served`); the API calls it too, and accepts the types
registered in its own process besides those the workers recorded. Importing a module
registers its handlers; a function that cannot be called as `fn(payload, ctx)` is refused
there, so a worker importing it stops at startup naming it.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, ParamSpec, TypeVar, cast
from uuid import UUID

from jobcore.environ import variable
from jobcore.errors import ConfigError, JobqueueError

if TYPE_CHECKING:
    from jobcore.task import Task

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

# Returns (or, `async def`, returns from its coroutine) the job's result: JSON-serialisable
# (with the conversions of `jobcore.results`), None for none.
Handler = Callable[[Any, JobContext], Any]
P = ParamSpec("P")
R = TypeVar("R")

# The create fields a handler may give defaults for, in the order records show them.
OPTION_FIELDS = ("queue", "priority", "max_attempts", "timeout")


class HandlerSignatureError(JobqueueError, TypeError):
    """A function registered as a handler cannot be called as `fn(payload, ctx)`."""


class HandlerOptionsError(JobqueueError, ValueError):
    """A handler's options break the rules of a create request's fields."""


@dataclass(frozen=True)
class HandlerOptions:
    """A type's defaults for the create fields a request omits (explicit field > handler
    option > global default). None: no default of the handler's, the global one applies.
    `timeout` is in seconds."""

    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    timeout: float | None = None

    def fields(self) -> dict[str, Any]:
        """The options that are set, as create fields (also the JSON `job_types` records)."""
        return {
            name: getattr(self, name) for name in OPTION_FIELDS if getattr(self, name) is not None
        }

    @classmethod
    def check(cls, job_type: str, fields: Mapping[str, Any]) -> HandlerOptions:
        """Options as given to `@handler` (a timeout may be a duration such as "1m"), checked
        with the rules of a create request's fields (`jobcore.validation`)."""
        given = {name: value for name, value in fields.items() if value is not None}
        if not given:
            return NO_OPTIONS
        unknown = set(given) - set(OPTION_FIELDS)
        if unknown:
            raise HandlerOptionsError(
                f"handler {job_type!r}: unknown option(s) {', '.join(sorted(unknown))}; "
                f"allowed: {', '.join(OPTION_FIELDS)}"
            )
        # Imported here: it brings the table's limits (SQLAlchemy) along, which a module
        # whose handlers take no options never needs.
        from jobcore import validation

        try:
            new = validation.new_job(
                {"type": job_type, **given}, known_types=(job_type,), default_max_attempts=1
            )
        except validation.InvalidRequest as exc:
            message = str(exc).replace("field '", "option '")
            raise HandlerOptionsError(f"handler {job_type!r}: {message}") from None
        return cls(
            queue=new.queue if "queue" in given else None,
            priority=new.priority if "priority" in given else None,
            max_attempts=new.max_attempts if "max_attempts" in given else None,
            timeout=new.timeout if "timeout" in given else None,
        )


NO_OPTIONS = HandlerOptions()


@dataclass(frozen=True)
class Registration:
    """What `@handler` recorded for a type: its function and its options."""

    type: str
    fn: Handler
    options: HandlerOptions


_registry: dict[str, Registration] = {}
# What `known()` last returned, and the size of the registry it was made from (a handler is
# never unregistered: a change of size is a change).
_known: tuple[int, frozenset[str], dict[str, dict[str, Any]]] = (-1, frozenset(), {})


def handler(
    job_type: str,
    *,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    timeout: float | str | None = None,
) -> Callable[[Callable[P, R]], Task[P, R]]:
    """Register the decorated function (async or plain) as the handler of `job_type`, with
    defaults for the jobs of that type whose create request omits the field. What it
    returns is the job's result: JSON-serialisable, None for none.

    The decorator returns a `Task`: still callable as the function, and it submits jobs of
    its type (`submit`, `enqueue`). Raises `HandlerOptionsError` (a ValueError) for an
    invalid option and `HandlerSignatureError` (a TypeError) naming a function that cannot
    be called as `fn(payload, ctx)`, when the module declaring it is imported.
    """
    if not isinstance(job_type, str) or not job_type.strip():
        raise ValueError("a handler type must be a non-empty string")
    options = HandlerOptions.check(
        job_type,
        {"queue": queue, "priority": priority, "max_attempts": max_attempts, "timeout": timeout},
    )

    def register(fn: Callable[P, R]) -> Task[P, R]:
        from jobcore.task import Task

        if isinstance(fn, Task):  # decorated twice: register the function itself
            fn = fn.fn
        _check_signature(job_type, fn)
        existing = _registry.get(job_type)
        if existing is not None and (existing.fn is not fn or existing.options != options):
            what = "with other options" if existing.fn is fn else f"by {existing.fn!r}"
            raise ValueError(f"handler type {job_type!r} is already registered {what}")
        _registry[job_type] = Registration(job_type, cast(Handler, fn), options)
        return Task(fn, job_type, options)

    return register


def _check_signature(job_type: str, fn: Callable[..., Any]) -> None:
    """Refuse, when it is registered rather than when its first job runs, a function that
    cannot take a job's two arguments."""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    module = getattr(fn, "__module__", None)
    where = f"{module}.{name}" if module else name
    if not callable(fn):
        raise HandlerSignatureError(f"handler {job_type!r} ({where}) is not callable")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # no signature to read (some builtins): the call itself will tell
    try:
        signature.bind(None, None)
    except TypeError as exc:
        raise HandlerSignatureError(
            f"handler {job_type!r} ({where}{signature}) cannot be called as fn(payload, ctx): {exc}"
        ) from None


def get_handler(job_type: str) -> Handler | None:
    found = _registry.get(job_type)
    return None if found is None else found.fn


def get_registration(job_type: str) -> Registration | None:
    return _registry.get(job_type)


def handler_options(job_type: str) -> HandlerOptions:
    """The options `job_type`'s handler was registered with (none when it has no handler
    in this process)."""
    found = _registry.get(job_type)
    return NO_OPTIONS if found is None else found.options


def registered_types() -> list[str]:
    return sorted(_registry)


def registered_options() -> dict[str, dict[str, Any]]:
    """Per registered type that has options, its options as create fields."""
    return known()[1]


def known() -> tuple[frozenset[str], dict[str, dict[str, Any]]]:
    """The registered types, and per type that has options its options as create fields;
    made again only when a handler was registered since (the submit paths ask every time)."""
    global _known
    size, types, options = _known
    if size != len(_registry):
        types = frozenset(_registry)
        options = {t: r.options.fields() for t, r in _registry.items() if r.options != NO_OPTIONS}
        _known = (len(_registry), types, options)
    return types, options


def load_handlers(modules: list[str]) -> None:
    """Import the built-in handlers and every module named in JOB_HANDLERS."""
    for name in BUILTIN_MODULES:
        importlib.import_module(name)
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any import failure is a configuration error
            raise ConfigError(variable("JOB_HANDLERS"), f"cannot import {name!r}: {exc}") from exc
