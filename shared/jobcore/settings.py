"""Configuration from environment variables (docs/configuration.md), validated once at startup.

`load_settings()` raises `ConfigError` naming the first variable at fault, so a
service can print one line and exit with status 2.
"""

from __future__ import annotations

import math
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
from jobcore.errors import ConfigError

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(value: object) -> float:
    """Seconds in a Go-style duration (`1m30s`, `500ms`, `1.5s`) or a plain number."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 500ms, 2s or 1m30s")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = str(value).strip()
        try:
            seconds = float(text)
        except ValueError:
            if not text or _PART.sub("", text) != "":
                raise ValueError(
                    f"{text!r} is not a duration (examples: 500ms, 2s, 1m30s)"
                ) from None
            seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{value!r} is not a non-negative duration")
    return seconds


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
}


def format_duration(seconds: float) -> str:
    """`86400.0` -> `24h`, `300.0` -> `5m`, `1.5` -> `1.5s`: how limits are shown."""
    for unit, size in (("h", _HOUR), ("m", _MINUTE)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def parse_addr(value: str) -> tuple[str, int]:
    """`host:port`, `:port` or `[v6]:port` -> (host, port); an empty host means all interfaces."""
    match = re.fullmatch(r"(?:\[([^\]]+)\]|([^:\[\]]*)):(\d{1,5})", value.strip())
    if match is None or not 0 <= int(match.group(3)) <= 65535:
        raise ValueError(f"{value!r} is not a listen address like :8080 or 127.0.0.1:8080")
    return (match.group(1) or match.group(2) or "0.0.0.0", int(match.group(3)))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", frozen=True)

    database_url: str = "postgresql://localhost:5432/jobqueue"
    http_addr: str = ":8080"
    metrics_addr: str = ":9090"
    worker_processes: int = Field(default=1, ge=1, le=256)
    workers: int = Field(default=4, ge=1, le=10_000)
    max_attempts: int = Field(default=5, ge=1, le=100)
    job_timeout: Duration = 30.0
    lease_duration: Duration = 60.0
    recovery_interval: Duration = 30.0
    poll_interval: Duration = 1.0
    backoff_base: Duration = 1.0
    backoff_max: Duration = 300.0
    shutdown_timeout: Duration = 20.0
    drain_delay: Duration = 0.0
    max_body_bytes: int = Field(default=1_048_576, ge=64)
    # API: the whole request body must arrive within this (slow clients get 408).
    request_body_timeout: Duration = 10.0
    # API: open client connections per process; more are closed at once.
    max_connections: int = Field(default=512, ge=1, le=100_000)
    job_handlers: str = ""
    webhook_allow_private: bool = False
    api_tokens: str = ""
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("log_level", mode="before")
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
        if self.lease_duration <= self.job_timeout + 5:
            raise _Relation(
                "lease_duration",
                f"must exceed JOB_TIMEOUT + 5s ({self.job_timeout + 5:g}s), "
                f"got {self.lease_duration:g}s",
            )
        if self.backoff_max < self.backoff_base:
            raise _Relation("backoff_max", "must not be smaller than BACKOFF_BASE")
        return self

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
