"""The worker's settings (`jobqueue-worker`): the shared ones and its own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from jobcore.settings.parsing import (
    Address,
    parse_addr,
    parse_key_concurrency,
    parse_queues,
    parse_type_concurrency,
    parse_type_rate,
)
from jobcore.settings.shared import (
    Duration,
    Lowered,
    PositiveDuration,
    Relation,
    SharedSettings,
    from_text,
    load,
)

# Heartbeats renew a lease every third of it: shorter ones would be renewed many times a
# second per worker process.
MIN_LEASE = 3.0

# The largest MAX_RESULT_BYTES: results are written in batches, a whole batch in one statement,
# and read back with every job record; anything bigger belongs in a store of its own.
MAX_RESULT_BYTES_LIMIT = 16 * 1024 * 1024

_DAY = 86400.0


class WorkerSettings(SharedSettings):
    """What `jobqueue-worker` reads: the shared variables and the worker's."""

    metrics_addr: Annotated[Address, from_text(parse_addr)] = parse_addr(":9090")
    worker_processes: int = Field(default=1, ge=1, le=256)
    # Slots per worker process of each queue given without its own; before `queues`, which
    # needs it.
    workers: int = Field(default=4, ge=1, le=10_000)
    # The queues served and the slots of each, per worker process (QUEUES: `name` or
    # `name:slots`, a name alone getting WORKERS slots).
    queues: dict[str, int] = Field(
        default_factory=lambda data: parse_queues("default", workers=data.get("workers", 1))
    )
    # Global limits per job type: type -> n processing at once (TYPE_CONCURRENCY), and
    # type -> (n attempts started, per window of this many seconds) (TYPE_RATE).
    type_concurrency: Annotated[dict[str, int], from_text(parse_type_concurrency)] = Field(
        default_factory=dict
    )
    type_rate: Annotated[dict[str, tuple[int, float]], from_text(parse_type_rate)] = Field(
        default_factory=dict
    )
    # Per queue (or "*", every queue without an entry): at most n jobs with one concurrency
    # key processing at once (KEY_CONCURRENCY).
    key_concurrency: Annotated[dict[str, int], from_text(parse_key_concurrency)] = Field(
        default_factory=dict
    )
    job_timeout: PositiveDuration = 30.0
    # Renewed every third of it while a job runs: a job may run far longer.
    lease_duration: Duration = 30.0
    recovery_interval: PositiveDuration = 30.0
    poll_interval: PositiveDuration = 1.0
    backoff_base: Duration = 1.0
    backoff_max: Duration = 300.0
    webhook_allow_private: bool = False
    # The largest result stored, in bytes of its JSON text; a larger one fails the attempt.
    max_result_bytes: int = Field(default=65_536, ge=1, le=MAX_RESULT_BYTES_LIMIT)
    # Finished jobs are deleted this long after they finished; 0 keeps them forever.
    retention_completed: Duration = _DAY
    retention_failed: Duration = 7 * _DAY  # failed and cancelled
    retention_dead_letter: Duration = 0.0
    # The most finished jobs retention deletes per second (a full batch of 5,000 at most
    # every 5000/RETENTION_RATE seconds), so a backlog of old jobs costs the queue little;
    # raise it where more jobs than this finish per second for hours.
    retention_rate: int = Field(default=5_000, ge=100, le=1_000_000)
    # Where autovacuum does not vacuum jobqueue's tables (off on the server or for a
    # table), one worker vacuums a table once it holds this many dead tuples; 0: never.
    vacuum_dead_tuples: int = Field(default=5_000, ge=0, le=1_000_000_000)
    # "off" lets the worker's own commits (claims, outcomes, heartbeats, maintenance)
    # return before their WAL is flushed; a PostgreSQL crash may then undo the last of them
    # (docs/worker.md, "Commit latency"). Submits are never affected.
    worker_synchronous_commit: Annotated[Literal["on", "off"], Lowered] = "on"

    @field_validator("queues", mode="before")
    @classmethod
    def _queues(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str):
            return value
        # An invalid WORKERS is reported first; the queues are still checked meanwhile.
        return parse_queues(value, workers=info.data.get("workers", 1))

    @model_validator(mode="after")
    def _relations(self) -> WorkerSettings:
        if self.lease_duration < MIN_LEASE:
            raise Relation(
                "lease_duration", f"must be at least {MIN_LEASE:g}s, got {self.lease_duration:g}s"
            )
        if self.backoff_max < self.backoff_base:
            raise Relation("backoff_max", "must not be smaller than BACKOFF_BASE")
        return self


def load_worker_settings(environ: Mapping[str, str] | None = None) -> WorkerSettings:
    """The worker's settings from `environ` (default: the process environment); the API's
    variables there are ignored. Raises ConfigError naming the first variable at fault."""
    return load(WorkerSettings, environ)
