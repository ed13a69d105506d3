"""What the API answers with, as small frozen dataclasses built from its JSON: a job record
(`Job`), a queue's depths (`QueueDepth`) and one item's result of a bulk submit
(`Submitted`). Each keeps the JSON it came from in `raw`.

They read what a later release of the API answers too (docs/upgrading.md): a field they do
not know is left in `raw`, and a job status they do not know is kept as it is (finished for
none of them). And what an earlier release answers: a job field it leaves out (declared with
`since` in `jobcore.record`) is read as null."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from jobcore import record
from jobcore.record import FailedAttempt as FailedAttempt
from jobcore.states import FINISHED, Status


@dataclass(frozen=True)
class Job:
    """A job record (docs/api.md#jobs): the fields of `jobcore.record.JOB_RECORD`, in its
    order, each read as its declaration says. `errors` (the failed attempts, oldest first)
    is None where the answer leaves it out: only `get` reads the full record."""

    id: str
    type: str
    payload: Any
    status: Status
    attempts: int
    max_attempts: int
    queue: str
    priority: int
    concurrency_key: str | None
    timeout: float | None
    run_at: datetime
    last_error: str | None
    result: Any
    cancel_requested_at: datetime | None
    finished_at: datetime | None
    created_at: datetime
    updated_at: datetime
    errors: tuple[FailedAttempt, ...] | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def finished(self) -> bool:
        """Completed, failed, dead_letter or cancelled: what `wait` waits for."""
        return self.status in FINISHED

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Job:
        fields = {declared.name: declared.read(data) for declared in record.JOB_RECORD}
        return cls(**fields, raw=data)


@dataclass(frozen=True)
class QueueDepth:
    """One queue's depths (docs/api.md#queues)."""

    queue: str
    pending: int
    scheduled: int
    processing: int
    dead_letter: int
    oldest_pending_age_seconds: float
    paused: bool  # no worker claims from it (docs/api.md#pausing-a-queue)
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QueueDepth:
        return cls(
            queue=data["queue"],
            pending=data["pending"],
            scheduled=data["scheduled"],
            processing=data["processing"],
            dead_letter=data["dead_letter"],
            oldest_pending_age_seconds=data["oldest_pending_age_seconds"],
            paused=bool(data.get("paused", False)),  # an API before pausing has none
            raw=data,
        )


@dataclass(frozen=True)
class Submitted:
    """One item's result of `submit_many`: `status` is "created", "replayed" (its
    idempotency key names an existing job of the same request) or "conflict" (the key is
    bound to a different request: `id` is None and `error` says so)."""

    status: str
    id: str | None
    idempotency_key: str
    error: str | None = None
