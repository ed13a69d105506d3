"""The API's settings (`jobqueue-api`): the shared ones and its own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import Field, field_validator

from jobcore.settings.parsing import Address, PendingCaps, parse_addr, parse_max_pending
from jobcore.settings.shared import (
    Duration,
    Names,
    PositiveDuration,
    SharedSettings,
    from_text,
    load,
)

# The longest type JOB_TYPES takes: longer ones are surely a mistake (a pasted value).
MAX_TYPE_LENGTH = 255


class ApiSettings(SharedSettings):
    """What `jobqueue-api` reads: the shared variables and the API's."""

    http_addr: Annotated[Address, from_text(parse_addr)] = parse_addr(":8080")
    # Bearer tokens for /jobs..., /queues and the dashboard; empty: the API is open.
    # repr=False: secrets.
    api_tokens: Names = Field(default_factory=list, repr=False)
    # Admission control: the most pending jobs per queue; PendingCaps({}, None): no cap.
    max_pending: Annotated[PendingCaps, from_text(parse_max_pending)] = Field(
        default_factory=lambda: PendingCaps({}, None)
    )
    drain_delay: Duration = 0.0
    max_body_bytes: int = Field(default=1_048_576, ge=64)
    # The whole request body must arrive within this (slow clients get 408).
    request_body_timeout: PositiveDuration = 10.0
    # Open client connections per process; more are closed at once. Each waiter
    # (`GET /jobs/{id}?wait=`) holds one: the default leaves room for a thousand of them.
    max_connections: int = Field(default=2048, ge=1, le=100_000)
    # Processes serving HTTP_ADDR (one socket, shared nothing else but the database).
    api_processes: int = Field(default=1, ge=1, le=64)
    # Types a submit accepts besides those registered in this process and those the
    # workers recorded (`jobcore.catalog`): for types no worker has recorded yet.
    job_types: Names = Field(default_factory=list)

    @field_validator("job_types")
    @classmethod
    def _type_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if len(name) > MAX_TYPE_LENGTH or not name.isprintable():
                raise ValueError(
                    f"each type must be 1 to {MAX_TYPE_LENGTH} printable characters, "
                    f"got {name[:40]!r}"
                )
        return names


def load_api_settings(environ: Mapping[str, str] | None = None) -> ApiSettings:
    """The API's settings from `environ` (default: the process environment); the worker's
    variables there are ignored. Raises ConfigError naming the first variable at fault."""
    return load(ApiSettings, environ)
