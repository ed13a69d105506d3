"""Typed errors shared by the store, the services and handlers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobcore.store import Lease


class JobqueueError(Exception):
    """Base class of every error this project raises on purpose."""


class PermanentError(JobqueueError):
    """Raised by a handler when retrying cannot help: the job goes to `failed`."""


class LeaseLost(JobqueueError):
    """An outcome write matched no row: the lease expired or a newer claim owns the job."""

    def __init__(self, operation: str, leases: Sequence[Lease]) -> None:
        self.operation = operation
        self.leases = list(leases)
        shown = ", ".join(f"{lease.job_id}@{lease.lease_token}" for lease in self.leases[:5])
        more = f" (+{len(self.leases) - 5} more)" if len(self.leases) > 5 else ""
        super().__init__(f"{operation}: lease lost for {shown}{more}")


class IdempotencyConflict(JobqueueError):
    """The idempotency key is already bound to a different request."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"Idempotency-Key {key!r} was already used for a different request")


class ConfigError(JobqueueError):
    """Invalid configuration; `variable` names the environment variable at fault."""

    def __init__(self, variable: str, message: str) -> None:
        self.variable = variable
        self.message = message
        super().__init__(f"{variable}: {message}")


class SchemaNotAtHead(JobqueueError):
    """The database schema is missing or older than this code expects."""

    def __init__(self, found: str | None, expected: str) -> None:
        self.found = found
        self.expected = expected
        super().__init__(
            f"database schema is at revision {found or 'none'}, this version needs "
            f"{expected}: run `alembic upgrade head` first"
        )
