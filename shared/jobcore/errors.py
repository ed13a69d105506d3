"""Typed errors shared by the store, the services and handlers."""

from __future__ import annotations


class JobqueueError(Exception):
    """Base class of every error this project raises on purpose."""


class PermanentError(JobqueueError):
    """Raised by a handler when retrying cannot help: the job goes to `failed`."""


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


def describe(exc: BaseException) -> str:
    """`Type: message` (or the type alone) for logs and last_error."""
    text = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {text}" if text else name
