"""The JSON shapes of what the API answers with: a job record, a job's status, a queue's
depths, and the response that carries them (`JSONBody`). One place, so every endpoint
shows a job the same way; the job's fields are declared in `jobcore.record`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.responses import JSONResponse

from jobcore import record
from jobcore.rows import Job
from jobcore.search import QueueDepth
from jobqueue_api import jsonio


class JSONBody(JSONResponse):
    """Starlette's JSONResponse, rendered with orjson where that gives the same document."""

    def render(self, content: Any) -> bytes:
        return jsonio.dumps(content)


def _writer(name: str, fields: tuple[record.Field, ...]) -> Callable[[Job], dict[str, Any]]:
    """A function that writes `fields` of a row as a JSON object, generated from their
    declaration the way `dataclasses` generates `__init__`: one dict display, as fast as a
    hand-written one (a loop over the fields takes a quarter longer, on the hot path of
    POST /jobs)."""
    namespace: dict[str, Any] = {}
    items = []
    for i, field in enumerate(fields):
        value = f"job.{field.name}"
        if field.kind.write is not None:
            namespace[f"_write{i}"] = field.kind.write
            written = f"_write{i}({value})"
            value = f"None if {value} is None else {written}" if field.nullable else written
        items.append(f"{field.name!r}: {value}")
    source = f"def {name}(job):\n    return {{{', '.join(items)}}}\n"
    # Named for this file, so that tracebacks and profiles (bench/api.py) point here.
    exec(compile(source, f"<jobqueue_api/records.py: {name}>", "exec"), namespace)
    function: Callable[[Job], dict[str, Any]] = namespace[name]
    function.__module__ = __name__
    function.__doc__ = f"The {', '.join(field.name for field in fields)} of `job`, as JSON."
    return function


# A job as lists, submits and the control actions answer it; the full record (GET
# /jobs/{id}); the job's status (GET /jobs/{id}/status).
job_json = _writer("job_json", record.JOB)
record_json = _writer("record_json", record.JOB_RECORD)
status_json = _writer("status_json", record.JOB_STATUS)


def depth_json(depth: QueueDepth, paused: bool = False) -> dict[str, Any]:
    return {
        "queue": depth.queue,
        "pending": depth.pending,
        "scheduled": depth.scheduled,
        "processing": depth.processing,
        "dead_letter": depth.dead_letter,
        "oldest_pending_age_seconds": depth.oldest_pending_age_seconds,
        "paused": paused,
    }
