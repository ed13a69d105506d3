"""The JSON shapes of what the API answers with: a job record, a job's status, a queue's
depths, and the response that carries them (`JSONBody`). One place, so every endpoint
shows a job the same way."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.responses import JSONResponse

from jobcore import store
from jobcore.search import QueueDepth
from jobqueue_api import jsonio


class JSONBody(JSONResponse):
    """Starlette's JSONResponse, rendered with orjson where that gives the same document."""

    def render(self, content: Any) -> bytes:
        return jsonio.dumps(content)


def timestamp(value: datetime | None) -> str | None:
    """RFC 3339 in UTC with microseconds: 2026-11-30T12:00:00.123456Z."""
    if value is None:
        return None
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    if value.year < 1000:  # isoformat pads the year to four digits, strftime does not
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    # isoformat() is a third of strftime's cost; it leaves out microseconds when 0.
    text = value.isoformat()  # 2026-11-30T12:00:00[.123456]+00:00
    return f"{text[:-6]}Z" if value.microsecond else f"{text[:-6]}.000000Z"


def job_json(job: store.Job) -> dict[str, Any]:
    return {
        "id": str(job.id),
        "type": job.type,
        "payload": job.payload,
        "status": job.status.value,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "queue": job.queue,
        "priority": job.priority,
        "timeout": job.timeout,
        "run_at": timestamp(job.run_at),
        "last_error": job.last_error,
        "result": job.result,
        "cancel_requested_at": timestamp(job.cancel_requested_at),
        "finished_at": timestamp(job.finished_at),
        "created_at": timestamp(job.created_at),
        "updated_at": timestamp(job.updated_at),
    }


def status_json(job: store.Job) -> dict[str, Any]:
    return {
        "id": str(job.id),
        "status": job.status.value,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "run_at": timestamp(job.run_at),
        "last_error": job.last_error,
    }


def depth_json(depth: QueueDepth) -> dict[str, Any]:
    return {
        "queue": depth.queue,
        "pending": depth.pending,
        "scheduled": depth.scheduled,
        "processing": depth.processing,
        "dead_letter": depth.dead_letter,
        "oldest_pending_age_seconds": depth.oldest_pending_age_seconds,
    }
