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


# SQLSTATEs duplicate_prepared_statement and invalid_sql_statement_name: asyncpg's prepared
# statements meeting a pooler in transaction mode that does not keep them per client.
_POOLED_STATEMENTS = frozenset({"42P05", "26000"})
POOLER_HINT = (
    "a pooler in transaction mode that does not keep prepared statements per client"
    " (PgBouncer older than 1.21, or max_prepared_statements = 0): use PgBouncer 1.21 or"
    " newer with max_prepared_statements > 0, or pool_mode = session"
)


def describe(exc: BaseException) -> str:
    """`Type: message` (or the type alone) for logs and last_error; with what to do when
    the error is a pooler's that an operator must fix (`POOLER_HINT`)."""
    text = str(exc).strip()
    name = type(exc).__name__
    found = f"{name}: {text}" if text else name
    return f"{found} ({POOLER_HINT})" if pooled_statements_lost(exc) else found


def pooled_statements_lost(exc: BaseException) -> bool:
    """Whether `exc` (asyncpg's error, or SQLAlchemy's wrapping it) is a prepared statement
    of asyncpg's found missing or taken on the server: a pooler lent the session to
    another client between its statements."""
    seen: BaseException | None = exc
    for _ in range(4):  # SQLAlchemy's error, its DBAPI adapter's, asyncpg's
        if seen is None:
            break
        if getattr(seen, "sqlstate", None) in _POOLED_STATEMENTS and "__asyncpg_" in str(seen):
            return True
        seen = getattr(seen, "orig", None) or seen.__cause__
    return False
