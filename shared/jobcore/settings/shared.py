"""The settings both services read, the base of `ApiSettings` and `WorkerSettings`, and the
loading that turns an environment into one of them or a `ConfigError`."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from jobcore.db import check_url
from jobcore.durations import format_duration, parse_duration
from jobcore.environ import read as environ_read
from jobcore.errors import ConfigError, JobqueueError
from jobcore.naming import DEFAULT_SCHEMA
from jobcore.naming import check as check_schema_name
from jobcore.settings.parsing import parse_list
from jobcore.validation import DEFAULT_MAX_ATTEMPTS, MAX_ATTEMPTS, MIN_ATTEMPTS

Duration = Annotated[float, BeforeValidator(parse_duration)]

_MINUTE, _HOUR, _DAY = 60.0, 3600.0, 86400.0

# Upper bound of every duration setting, of either service, in seconds. Far above any
# sensible value, far below what breaks: PostgreSQL intervals, timestamps and asyncio
# timers all take them.
DURATION_LIMITS = {
    "shutdown_timeout": _HOUR,
    # API
    "drain_delay": _HOUR,
    "request_body_timeout": 5 * _MINUTE,
    # Worker
    "job_timeout": _DAY,
    # Must exceed JOB_TIMEOUT + 5s, so a day-long JOB_TIMEOUT still has room.
    "lease_duration": 2 * _DAY,
    "recovery_interval": _HOUR,
    "poll_interval": _HOUR,
    "backoff_base": _DAY,
    "backoff_max": _DAY,
    # Ten years: finished jobs kept longer than that are better kept forever (0).
    "retention_completed": 3650 * _DAY,
    "retention_failed": 3650 * _DAY,
    "retention_dead_letter": 3650 * _DAY,
}


def from_text(parse: Callable[[str], Any]) -> BeforeValidator:
    """Parse a variable's text with `parse`; a value of the field's type is taken as it is."""
    return BeforeValidator(lambda value: parse(value) if isinstance(value, str) else value)


def _positive(value: float) -> float:
    if value <= 0:
        raise ValueError("must be greater than zero")
    return value


PositiveDuration = Annotated[Duration, AfterValidator(_positive)]
# Any case, blanks around ignored: `LOG_LEVEL`, `WORKER_SYNCHRONOUS_COMMIT`.
Lowered = BeforeValidator(lambda value: value.strip().lower() if isinstance(value, str) else value)
Names = Annotated[list[str], from_text(parse_list)]


class Relation(JobqueueError, ValueError):
    """A refusal that names its variable itself (`field`) and shows no value: a relation
    between settings, or a value that must not be echoed."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


class SharedSettings(BaseModel):
    """The variables both services read."""

    # Built from the environment by `load` only: the names are the variables', lowercased.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    # repr=False: the URL may hold a password.
    database_url: str = Field(default="postgresql://localhost:5432/jobqueue", repr=False)
    # The LISTEN connections' URL (`listen_url`); empty: DATABASE_URL's. A pooler in
    # transaction mode in front of the database cannot hold a LISTEN: these go around it.
    database_listen_url: str = Field(default="", repr=False)
    # The PostgreSQL schema holding every object of jobqueue's (jobcore.naming).
    database_schema: Annotated[str, AfterValidator(check_schema_name)] = DEFAULT_SCHEMA
    log_level: Annotated[Literal["debug", "info", "warning", "error"], Lowered] = "info"
    # Modules imported at startup; importing them registers their handlers.
    job_handlers: Names = Field(default_factory=list)
    # The attempt budget of a job submitted without one (the worker's periodic jobs too).
    max_attempts: int = Field(default=DEFAULT_MAX_ATTEMPTS, ge=MIN_ATTEMPTS, le=MAX_ATTEMPTS)
    # API: in-flight requests after the listener closed; worker: running jobs after SIGTERM.
    shutdown_timeout: Duration = 20.0

    @field_validator("database_url", "database_listen_url")
    @classmethod
    def _postgres_url(cls, value: str, info: ValidationInfo) -> str:
        if info.field_name == "database_listen_url" and value == "":
            return value
        try:
            check_url(value)
        except ValueError as exc:
            # The URL itself is never echoed: it may hold a password.
            raise Relation(str(info.field_name), str(exc)) from None
        return value

    @property
    def listen_url(self) -> str:
        """Where the LISTEN connections go (worker wake-ups, cancels and pauses; the API's
        `?wait=`): DATABASE_LISTEN_URL, else DATABASE_URL."""
        return self.database_listen_url or self.database_url

    @field_validator("*")
    @classmethod
    def _bounded(cls, value: Any, info: ValidationInfo) -> Any:
        """Every duration named in DURATION_LIMITS, whichever class it belongs to."""
        limit = DURATION_LIMITS.get(str(info.field_name))
        if limit is not None and value > limit:
            raise ValueError(f"must be at most {format_duration(limit)}")
        return value


S = TypeVar("S", bound=SharedSettings)


def load(cls: type[S], environ: Mapping[str, str] | None = None) -> S:
    """Read and validate `cls`'s variables from `environ` (default: the process environment),
    each as `NAME` or `JOBQUEUE_NAME` (which wins, `jobcore.environ`); others are ignored, so
    one environment may serve both services. Names are matched case-insensitively. Raises
    ConfigError naming the first variable at fault as it was read."""
    found = environ_read(cls.model_fields, environ)
    values = {field: text for field, (_, text) in found.items()}
    # The variable each field was read from, upper-cased: what errors name.
    names = {field: variable.upper() for field, (variable, _) in found.items()}

    def named(field: str) -> str:
        return names.get(field, field.upper())

    def renamed(message: str) -> str:
        """A message naming other settings (`must not be smaller than BACKOFF_BASE`) names
        them as they were read."""
        return re.sub(
            r"\b[A-Z][A-Z0-9_]*\b",
            lambda m: named(m.group(0).lower()) if m.group(0).lower() in names else m.group(0),
            message,
        )

    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, Relation):
            raise ConfigError(named(cause.field), renamed(str(cause))) from None
        field = str(error["loc"][0]) if error["loc"] else "configuration"
        message = str(error["msg"]).removeprefix("Value error, ")
        got = error.get("input")
        raise ConfigError(named(field), f"{renamed(message)} (got {got!r})") from None
