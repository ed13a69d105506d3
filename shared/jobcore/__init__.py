"""jobcore: the job state machine, its SQL, and what both services share.

Importing jobcore performs no I/O. Handler authors need only:

    from jobcore import handler, PermanentError, JobContext

(`@handler` returns a `Task`: the function, plus `submit` and `enqueue` for its type; to run
a handler in a test, `from jobcore.testing import run`), and to declare periodic jobs,
`from jobcore import periodic`. To enqueue jobs in one's own database transaction,
`from jobcore import enqueue, enqueue_many` (imported on first use: they bring SQLAlchemy's
statements along).
"""

from typing import TYPE_CHECKING, Any

from jobcore.backoff import backoff
from jobcore.errors import (
    ConfigError,
    IdempotencyConflict,
    InvalidRequest,
    JobqueueError,
    PermanentError,
    SchemaNotAtHead,
    Snooze,
)
from jobcore.periodic import periodic
from jobcore.registry import HandlerOptions, JobContext, handler
from jobcore.states import TRANSITIONS, Operation, Status
from jobcore.task import Task

if TYPE_CHECKING:
    from jobcore.transactional import enqueue, enqueue_many

__all__ = [
    "TRANSITIONS",
    "ConfigError",
    "HandlerOptions",
    "IdempotencyConflict",
    "InvalidRequest",
    "JobContext",
    "JobqueueError",
    "Operation",
    "PermanentError",
    "SchemaNotAtHead",
    "Snooze",
    "Status",
    "Task",
    "backoff",
    "enqueue",
    "enqueue_many",
    "handler",
    "periodic",
]

_LAZY = {"enqueue": "jobcore.transactional", "enqueue_many": "jobcore.transactional"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jobcore' has no attribute {name!r}")
