"""Configuration from environment variables (docs/configuration.md), validated once at startup.

`load_settings()` raises `ConfigError` naming the first variable at fault, so a
service can print one line and exit with status 2.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from jobcore.db import check_url
from jobcore.durations import format_duration, parse_duration
from jobcore.errors import ConfigError
from jobcore.schema import QUEUE_PATTERN

Duration = Annotated[float, BeforeValidator(parse_duration)]


_MINUTE, _HOUR, _DAY = 60.0, 3600.0, 86400.0

# Upper bound of every duration setting, in seconds. Far above any sensible value, far
# below what breaks: PostgreSQL intervals, timestamps and asyncio timers all take them.
DURATION_LIMITS = {
    "job_timeout": _DAY,
    # Must exceed JOB_TIMEOUT + 5s, so a day-long JOB_TIMEOUT still has room.
    "lease_duration": 2 * _DAY,
    "recovery_interval": _HOUR,
    "poll_interval": _HOUR,
    "backoff_base": _DAY,
    "backoff_max": _DAY,
    "shutdown_timeout": _HOUR,
    "drain_delay": _HOUR,
    "request_body_timeout": 5 * _MINUTE,
    # Ten years: finished jobs kept longer than that are better kept forever (0).
    "retention_completed": 3650 * _DAY,
    "retention_failed": 3650 * _DAY,
    "retention_dead_letter": 3650 * _DAY,
}


def parse_addr(value: str) -> tuple[str, int]:
    """`host:port`, `:port` or `[v6]:port` -> (host, port); an empty host means all interfaces."""
    match = re.fullmatch(r"(?:\[([^\]]+)\]|([^:\[\]]*)):(\d{1,5})", value.strip())
    if match is None or not 0 <= int(match.group(3)) <= 65535:
        raise ValueError(f"{value!r} is not a listen address like :8080 or 127.0.0.1:8080")
    return (match.group(1) or match.group(2) or "0.0.0.0", int(match.group(3)))


# Heartbeats renew a lease every third of it: shorter ones would be renewed many times a
# second per worker process.
MIN_LEASE = 3.0


def parse_queues(value: str, *, workers: int) -> dict[str, int]:
    """`QUEUES`: comma-separated `name` or `name:slots`; a name alone gets `workers` slots."""
    queues: dict[str, int] = {}
    for item in value.split(","):
        name, _, slots = item.strip().partition(":")
        if not re.fullmatch(QUEUE_PATTERN, name):
            raise ValueError(f"queue name {name!r} must match {QUEUE_PATTERN}")
        if name in queues:
            raise ValueError(f"queue {name!r} is listed twice")
        if not slots:
            queues[name] = workers
        elif slots.isdigit() and 1 <= int(slots) <= 10_000:
            queues[name] = int(slots)
        else:
            raise ValueError(f"slots of queue {name!r} must be an integer from 1 to 10000")
    return queues


# The largest MAX_RESULT_BYTES: results are written in batches, a whole batch in one statement,
# and read back with every job record; anything bigger belongs in a store of its own.
MAX_RESULT_BYTES_LIMIT = 16 * 1024 * 1024


# The largest MAX_PENDING cap: far above any table a queue should hold, well inside bigint.
MAX_PENDING_CAP = 1_000_000_000


def parse_max_pending(value: str) -> tuple[dict[str, int], int | None]:
    """`MAX_PENDING`: `N` (every queue), `name:N,...` (those queues), or both (`N` for the
    queues not listed). Returns (caps by queue, cap of any other queue); empty: no cap."""
    caps: dict[str, int] = {}
    others: int | None = None
    if not value.strip():
        return caps, others
    for item in value.split(","):
        name, colon, number = item.strip().rpartition(":")
        if not colon:
            if others is not None:
                raise ValueError("a bare number (the cap of every other queue) is given twice")
        elif not re.fullmatch(QUEUE_PATTERN, name):
            raise ValueError(f"queue name {name!r} must match {QUEUE_PATTERN}")
        elif name in caps:
            raise ValueError(f"queue {name!r} is listed twice")
        digits = number.isascii() and number.isdigit() and len(number) <= 10
        if not (digits and 1 <= int(number) <= MAX_PENDING_CAP):
            where = f"of queue {name!r} " if colon else ""
            raise ValueError(f"the cap {where}must be an integer from 1 to {MAX_PENDING_CAP}")
        if colon:
            caps[name] = int(number)
        else:
            others = int(number)
    return caps, others


# TYPE_CONCURRENCY / TYPE_RATE: a job type as registered (any name without commas or
# whitespace); the limit after its last colon.
_TYPE_LIMIT_MAX = 1_000_000
_RATE_PERIODS = {"s": 1.0, "m": 60.0}


def _type_items(value: str) -> list[tuple[str, str]]:
    items: list[tuple[str, str]] = []
    if not value.strip():
        return items
    seen: set[str] = set()
    for item in value.split(","):
        name, colon, limit = item.strip().rpartition(":")
        if not colon or not name or any(ch.isspace() for ch in name):
            raise ValueError(f"{item.strip()!r} is not type:limit")
        if name in seen:
            raise ValueError(f"type {name!r} is listed twice")
        seen.add(name)
        items.append((name, limit))
    return items


def _count(limit: str, name: str, what: str) -> int:
    digits = limit.isascii() and limit.isdigit() and len(limit) <= 7
    if not (digits and 1 <= int(limit) <= _TYPE_LIMIT_MAX):
        raise ValueError(f"{what} of type {name!r} must be an integer from 1 to {_TYPE_LIMIT_MAX}")
    return int(limit)


def parse_type_concurrency(value: str) -> dict[str, int]:
    """`TYPE_CONCURRENCY`: `type:n,...`, at most n jobs of the type processing at once."""
    return {name: _count(limit, name, "the limit") for name, limit in _type_items(value)}


def parse_type_rate(value: str) -> dict[str, tuple[int, float]]:
    """`TYPE_RATE`: `type:n/s` or `type:n/m,...`, at most n attempts of the type started per
    second (per minute). Returns type -> (n, the window in seconds)."""
    rates: dict[str, tuple[int, float]] = {}
    for name, limit in _type_items(value):
        count, slash, unit = limit.partition("/")
        if not slash or unit not in _RATE_PERIODS:
            raise ValueError(f"the rate of type {name!r} must be n/s or n/m, got {limit!r}")
        rates[name] = (_count(count, name, "the rate"), _RATE_PERIODS[unit])
    return rates


class Settings(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", frozen=True)

    database_url: str = "postgresql://localhost:5432/jobqueue"
    http_addr: str = ":8080"
    metrics_addr: str = ":9090"
    worker_processes: int = Field(default=1, ge=1, le=256)
    workers: int = Field(default=4, ge=1, le=10_000)
    max_attempts: int = Field(default=5, ge=1, le=100)
    job_timeout: Duration = 30.0
    # Renewed every third of it while a job runs: a job may run far longer.
    lease_duration: Duration = 30.0
    recovery_interval: Duration = 30.0
    poll_interval: Duration = 1.0
    backoff_base: Duration = 1.0
    backoff_max: Duration = 300.0
    shutdown_timeout: Duration = 20.0
    drain_delay: Duration = 0.0
    max_body_bytes: int = Field(default=1_048_576, ge=64)
    # API: the whole request body must arrive within this (slow clients get 408).
    request_body_timeout: Duration = 10.0
    # API: open client connections per process; more are closed at once. Each waiter
    # (`GET /jobs/{id}?wait=`) holds one: the default leaves room for a thousand of them.
    max_connections: int = Field(default=2048, ge=1, le=100_000)
    # API: processes serving HTTP_ADDR (one socket, shared nothing else but the database).
    api_processes: int = Field(default=1, ge=1, le=64)
    job_handlers: str = ""
    webhook_allow_private: bool = False
    api_tokens: str = ""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Worker: the queues served, `name` or `name:slots` (a name alone gets WORKERS slots).
    queues: str = "default"
    # API: admission control, `N` or `name:N,...` pending jobs per queue; empty: no cap.
    max_pending: str = ""
    # Worker: global limits per job type, `type:n,...` and `type:n/s` or `type:n/m,...`.
    type_concurrency: str = ""
    type_rate: str = ""
    # Worker: the largest result stored, in bytes of its JSON text; a larger one fails the attempt.
    max_result_bytes: int = Field(default=65_536, ge=1, le=MAX_RESULT_BYTES_LIMIT)
    # Worker: finished jobs are deleted this long after they finished; 0 keeps them forever.
    retention_completed: Duration = _DAY
    retention_failed: Duration = 7 * _DAY  # failed and cancelled
    retention_dead_letter: Duration = 0.0
    # Worker: the most finished jobs retention deletes per second (a full batch of 5,000 at
    # most every 5000/RETENTION_RATE seconds), so a backlog of old jobs costs the queue
    # little; raise it where more jobs than this finish per second for hours.
    retention_rate: int = Field(default=5_000, ge=100, le=1_000_000)
    # Worker: where autovacuum does not vacuum jobqueue's tables (off on the server or for a
    # table), one worker vacuums a table once it holds this many dead tuples; 0: never.
    vacuum_dead_tuples: int = Field(default=5_000, ge=0, le=1_000_000_000)
    # Worker: "off" lets the worker's own commits (claims, outcomes, heartbeats, maintenance)
    # return before their WAL is flushed; a PostgreSQL crash may then undo the last of them
    # (docs/worker.md, "Commit latency"). Submits are never affected.
    worker_synchronous_commit: Literal["on", "off"] = "on"

    @field_validator("queues")
    @classmethod
    def _queues(cls, value: str) -> str:
        parse_queues(value, workers=1)
        return value

    @field_validator("max_pending")
    @classmethod
    def _max_pending(cls, value: str) -> str:
        parse_max_pending(value)
        return value

    @field_validator("type_concurrency")
    @classmethod
    def _type_concurrency(cls, value: str) -> str:
        parse_type_concurrency(value)
        return value

    @field_validator("type_rate")
    @classmethod
    def _type_rate(cls, value: str) -> str:
        parse_type_rate(value)
        return value

    @field_validator("log_level", "worker_synchronous_commit", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str) -> str:
        try:
            check_url(value)
        except ValueError as exc:
            # The URL itself is never echoed: it may hold a password.
            raise _Relation("database_url", str(exc)) from None
        return value

    @field_validator("http_addr", "metrics_addr")
    @classmethod
    def _addr(cls, value: str) -> str:
        parse_addr(value)
        return value

    @field_validator("job_timeout", "recovery_interval", "poll_interval", "request_body_timeout")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be greater than zero")
        return value

    @field_validator(*DURATION_LIMITS)
    @classmethod
    def _bounded(cls, value: float, info: ValidationInfo) -> float:
        limit = DURATION_LIMITS[str(info.field_name)]
        if value > limit:
            raise ValueError(f"must be at most {format_duration(limit)}")
        return value

    @model_validator(mode="after")
    def _relations(self) -> Settings:
        if self.lease_duration < MIN_LEASE:
            raise _Relation(
                "lease_duration", f"must be at least {MIN_LEASE:g}s, got {self.lease_duration:g}s"
            )
        if self.backoff_max < self.backoff_base:
            raise _Relation("backoff_max", "must not be smaller than BACKOFF_BASE")
        return self

    @property
    def queue_slots(self) -> dict[str, int]:
        """The queues this worker serves and the slots of each, per worker process."""
        return parse_queues(self.queues, workers=self.workers)

    @property
    def pending_caps(self) -> tuple[dict[str, int], int | None]:
        """MAX_PENDING: (caps by queue, cap of every queue not listed); ({}, None): no cap."""
        return parse_max_pending(self.max_pending)

    @property
    def type_concurrency_limits(self) -> dict[str, int]:
        return parse_type_concurrency(self.type_concurrency)

    @property
    def type_rate_limits(self) -> dict[str, tuple[int, float]]:
        return parse_type_rate(self.type_rate)

    @property
    def handler_modules(self) -> list[str]:
        return [m.strip() for m in self.job_handlers.split(",") if m.strip()]

    @property
    def tokens(self) -> list[str]:
        return [t.strip() for t in self.api_tokens.split(",") if t.strip()]


class _Relation(ValueError):
    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read and validate settings from `environ` (default: the process environment)."""
    try:
        if environ is None:
            return Settings()  # reads the process environment
        fields = Settings.model_fields
        values = {k.lower(): v for k, v in environ.items() if k.lower() in fields}
        return Settings.model_validate(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, _Relation):
            raise ConfigError(cause.field.upper(), str(cause)) from None
        field = str(error["loc"][0]) if error["loc"] else "configuration"
        message = str(error["msg"]).removeprefix("Value error, ")
        got = error.get("input")
        raise ConfigError(field.upper(), f"{message} (got {got!r})") from None
