"""Typed errors shared by the store, the services and handlers."""

from __future__ import annotations


class JobqueueError(Exception):
    """Base class of every error this project raises on purpose."""


class PermanentError(JobqueueError):
    """Raised by a handler when retrying cannot help: the job goes to `failed`."""


class Snooze(JobqueueError):
    """Raised by a handler to run the job again later without spending an attempt: it goes
    back to pending, due after `delay` (seconds, or a duration such as "30s" or "5m")."""

    MAX_DELAY = 366 * 86400.0

    def __init__(self, delay: float | str) -> None:
        from jobcore.durations import parse_duration

        seconds = parse_duration(delay)
        if seconds > self.MAX_DELAY:
            raise ValueError(f"a snooze of {delay!r} is longer than 366 days")
        self.seconds = seconds
        super().__init__(f"snoozed for {seconds:g}s")


class InvalidRequest(JobqueueError, ValueError):
    """A job request (or, at the API, any part of an HTTP request) breaks
    `jobcore.validation`'s rules: nothing was written. The message is meant for whoever
    sent it and names the field, header or query parameter at fault; the API answers it
    with 400 (which `jobcore.client` raises as `jobcore.client.Invalid`)."""


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
            f"{expected}: run `jobqueue migrate` first"
        )


class ReadOnlyServer(JobqueueError):
    """The server a connection reached takes no writes (a standby, or one set read-only):
    not the writable primary every service needs."""

    def __init__(self) -> None:
        super().__init__("the database server is read-only (a standby?): no writable primary")


def describe(exc: BaseException) -> str:
    """`Type: message` (or the type alone) for logs and last_error."""
    text = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {text}" if text else name
