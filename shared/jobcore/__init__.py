"""jobcore: the job state machine, its SQL, and what both services share.

Importing jobcore performs no I/O. Handler authors need only:

    from jobcore import handler, PermanentError, JobContext

and to declare periodic jobs, `from jobcore import periodic`.
"""

from jobcore.backoff import backoff
from jobcore.errors import (
    ConfigError,
    IdempotencyConflict,
    JobqueueError,
    PermanentError,
    SchemaNotAtHead,
    Snooze,
)
from jobcore.periodic import periodic
from jobcore.registry import JobContext, handler
from jobcore.states import TRANSITIONS, Operation, Status

__all__ = [
    "TRANSITIONS",
    "ConfigError",
    "IdempotencyConflict",
    "JobContext",
    "JobqueueError",
    "Operation",
    "PermanentError",
    "SchemaNotAtHead",
    "Snooze",
    "Status",
    "backoff",
    "handler",
    "periodic",
]
