"""The OpenAPI 3.1 document served at `/openapi.json`, built from the live configuration.

Job types come from the handler registry and security from API_TOKENS, so the
document describes exactly what this process accepts.
"""

from __future__ import annotations

from typing import Any

from jobcore import record
from jobcore.bulk import DEFAULT_BULK_LIMIT, MAX_BULK_LIMIT, MAX_IDS
from jobcore.durations import format_duration
from jobcore.schema import MAX_KEY_LENGTH as MAX_CONCURRENCY_KEY_LENGTH
from jobcore.schema import MAX_PRIORITY, MAX_TIMEOUT, MIN_PRIORITY, MIN_TIMEOUT, QUEUE_PATTERN
from jobcore.search import DEFAULT_LIMIT, MAX_LIMIT
from jobcore.states import Operation, Status
from jobqueue_api.validation import (
    CONCURRENCY_KEY_PATTERN,
    CURSOR_PATTERN,
    DURATION_PATTERN,
    MAX_ATTEMPTS,
    MAX_BATCH,
    MAX_DELAY,
    MAX_DEPTH,
    MAX_KEY_LENGTH,
    MAX_WAIT,
    MIN_ATTEMPTS,
    MIN_DELAY,
    TIMESTAMP_PATTERN,
)

_REF = "#/components/schemas/"
_ID = dict(record.UUID.schema)
_STATUSES = [s.value for s in Status]


# What jsonb can store, so that clients and fuzzers see the U+0000 rule in the schema
# itself (the depth limit cannot be expressed; the description states it).
_NO_NUL = {"pattern": "^[^\\u0000]*$"}
_PAYLOAD = {
    "anyOf": [
        {"type": ["null", "boolean", "number"]},
        {"type": "string", **_NO_NUL},
        {"type": "array", "items": {"$ref": _REF + "Payload"}},
        {
            "type": "object",
            "propertyNames": _NO_NUL,
            "additionalProperties": {"$ref": _REF + "Payload"},
        },
    ]
}


_QUEUE = {"type": "string", "pattern": QUEUE_PATTERN}
_PRIORITY = {"type": "integer", "minimum": MIN_PRIORITY, "maximum": MAX_PRIORITY}
_CONCURRENCY_KEY = {
    "minLength": 1,
    "maxLength": MAX_CONCURRENCY_KEY_LENGTH,
    "pattern": CONCURRENCY_KEY_PATTERN,
}


def _duration(low: float, high: float, description: str) -> dict[str, Any]:
    """Seconds as a number, or a Go duration string (whose range no pattern can state)."""
    return {
        "anyOf": [
            {"type": "number", "minimum": low, "maximum": high},
            {"type": "string", "pattern": DURATION_PATTERN},
        ],
        "description": (
            f"{description} Seconds, or a Go duration such as 90s, 1m30s or 1.5h; "
            f"from {format_duration(low)} to {format_duration(high)}."
        ),
    }


def _scheduling() -> dict[str, Any]:
    return {
        "queue": {**_QUEUE, "default": "default", "description": "The queue the job waits in."},
        "priority": {
            **_PRIORITY,
            "default": 0,
            "description": "Among due jobs of a queue, higher runs first.",
        },
        "run_at": {
            "type": "string",
            "format": "date-time",
            "pattern": TIMESTAMP_PATTERN,
            "description": (
                "RFC 3339 with an offset (Z or +hh:mm), at most 9999-12-31T23:59:59Z: "
                "the job is not claimed before it; a past time means now. Not with delay."
            ),
        },
        "delay": _duration(
            MIN_DELAY,
            MAX_DELAY,
            "Due this long after the database's now(). Not together with run_at.",
        ),
        "timeout": _duration(
            MIN_TIMEOUT,
            MAX_TIMEOUT,
            "This job's per-attempt limit, instead of the worker's JOB_TIMEOUT.",
        ),
        "concurrency_key": {
            "type": "string",
            **_CONCURRENCY_KEY,
            "description": (
                f"1 to {MAX_CONCURRENCY_KEY_LENGTH} characters, no control characters (nor "
                "U+2028, U+2029). Jobs of one key take turns with other keys' jobs and share "
                "the workers' KEY_CONCURRENCY limit; without one (the default), neither."
            ),
        },
    }


# What the API and the schema allow of the job record's values, beyond each field's kind.
_LIMITS: dict[str, dict[str, Any]] = {
    "attempts": {"minimum": 0},
    "max_attempts": {"minimum": MIN_ATTEMPTS, "maximum": MAX_ATTEMPTS},
    "queue": _QUEUE,
    "priority": _PRIORITY,
    "timeout": {"minimum": MIN_TIMEOUT, "maximum": MAX_TIMEOUT},
    "concurrency_key": _CONCURRENCY_KEY,
}


def _property(field: record.Field) -> dict[str, Any]:
    """A field of the job record (`jobcore.record`) as a JSON Schema, with its limits."""
    schema = {**field.kind.schema, **_LIMITS.get(field.name, {})}
    if field.nullable and "type" in schema:
        schema["type"] = [schema["type"], "null"]
    note = field.kind.note
    schema["description"] = f"{note}: {field.description}" if note else field.description
    return schema


def _record(fields: tuple[record.Field, ...]) -> dict[str, Any]:
    return _object({field.name: _property(field) for field in fields})


def _schemas(job_types: list[str], default_max_attempts: int) -> dict[str, Any]:
    create: dict[str, Any] = {
        "type": "object",
        "required": ["type"],
        "additionalProperties": False,
        "properties": {
            "type": {
                "type": "string",
                "enum": job_types,
                "description": "A registered handler type.",
            },
            "payload": {
                "$ref": _REF + "Payload",
                "description": (
                    "Any JSON value (default {}). Strings, keys included, must not "
                    f"contain U+0000; nesting is limited to {MAX_DEPTH} levels."
                ),
                "default": {},
            },
            "max_attempts": {
                "type": "integer",
                "minimum": MIN_ATTEMPTS,
                "maximum": MAX_ATTEMPTS,
                "default": default_max_attempts,
            },
            **_scheduling(),
        },
        "not": {"required": ["run_at", "delay"]},
    }
    return {
        "Job": _record(record.JOB),
        "JobRecord": _record(record.JOB_RECORD),
        "JobStatus": _record(record.JOB_STATUS),
        "CreateJob": create,
        "BatchItem": {
            **create,
            "properties": {**create["properties"], "idempotency_key": _KEY_SCHEMA},
        },
        "BatchRequest": _object(
            {
                "jobs": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_BATCH,
                    "items": {"$ref": _REF + "BatchItem"},
                }
            }
        ),
        "BatchResults": _object(
            {
                "results": {
                    "type": "array",
                    "description": "One result per submitted item, in input order.",
                    "items": {
                        "oneOf": [
                            _object({"status": {"enum": ["created", "replayed"]}, "id": _ID}),
                            _object({"status": {"const": "conflict"}, "error": {"type": "string"}}),
                        ]
                    },
                }
            }
        ),
        "JobList": _object(
            {
                "jobs": {
                    "type": "array",
                    "maxItems": MAX_LIMIT,
                    "description": "Newest first.",
                    "items": {"$ref": _REF + "Job"},
                },
                "next_cursor": {
                    "type": ["string", "null"],
                    "description": "Pass as cursor for the next page; null on the last page.",
                },
            }
        ),
        "QueueDepths": _object(
            {
                "queues": {
                    "type": "array",
                    "description": "Every queue that holds jobs, by name.",
                    "items": _object(
                        {
                            "queue": _QUEUE,
                            "pending": _count("Pending jobs that are due."),
                            "scheduled": _count("Pending jobs not due yet."),
                            "processing": _count("Jobs a worker is running."),
                            "dead_letter": _count("Jobs in dead_letter."),
                            "oldest_pending_age_seconds": {
                                "type": "number",
                                "minimum": 0,
                                "description": "How long the longest-due pending job has "
                                "been due; 0 when none is.",
                            },
                            "paused": {
                                "type": "boolean",
                                "description": "No worker claims from the queue. A paused "
                                "queue is listed even while it holds no jobs.",
                            },
                        }
                    ),
                }
            }
        ),
        "QueuePaused": _object(
            {
                "queue": _QUEUE,
                "paused": {"type": "boolean", "description": "Whether it is paused now."},
            }
        ),
        "BulkFilter": {
            "type": "object",
            "additionalProperties": False,
            "description": "Which jobs: those matching every field given (at least one of "
            "status, type, queue or ids), at most `limit` of them.",
            # A field that is null counts as absent.
            "anyOf": [
                {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
                for name in ("status", "type", "queue", "ids")
            ],
            "properties": {
                "status": {
                    "description": "A list of statuses, or a comma-separated string.",
                    "oneOf": [
                        {"type": "array", "minItems": 1, "items": {"enum": _STATUSES}},
                        {
                            "type": "string",
                            "pattern": f"^({'|'.join(_STATUSES)})(,({'|'.join(_STATUSES)}))*$",
                        },
                        {"type": "null"},
                    ],
                },
                "type": {"type": ["string", "null"], "minLength": 1, **_NO_NUL},
                "queue": {"anyOf": [_QUEUE, {"type": "null"}]},
                "ids": {
                    "type": ["array", "null"],
                    "maxItems": MAX_IDS,
                    "items": {"type": "string", "format": "uuid"},
                    "description": "Job ids; unknown ones are ignored.",
                },
                "limit": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "maximum": MAX_BULK_LIMIT,
                    "default": DEFAULT_BULK_LIMIT,
                },
            },
        },
        "BulkCancelled": _object(
            {
                "cancelled": _count("Pending and dead_letter jobs cancelled."),
                "cancel_requested": _count(
                    "Processing jobs whose workers were asked to stop them."
                ),
                "more": {
                    "type": "boolean",
                    "description": "Matching jobs that allow it were left (the limit).",
                },
            }
        ),
        "BulkRetried": _object(
            {
                "retried": _count("Jobs requeued with a fresh attempt budget."),
                "more": {
                    "type": "boolean",
                    "description": "Matching jobs that allow it were left (the limit).",
                },
            }
        ),
        "Payload": _PAYLOAD,
        "Error": _object({"error": {"type": "string"}}),
        "Health": _object({"status": {"type": "string"}}),
        "Ready": {
            **_object({"status": {"type": "string"}}),
            "properties": {
                "status": {"type": "string"},
                "notifications": {
                    "type": "string",
                    "enum": ["ok", "unheard", "unchecked"],
                    "description": "The latest notification check's verdict: whether this "
                    "process's LISTEN connection hears what it sends itself.",
                },
            },
        },
    }


def _count(description: str) -> dict[str, Any]:
    return {"type": "integer", "minimum": 0, "description": description}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": list(properties),
        "additionalProperties": False,
        "properties": properties,
    }


_REQUEST_ID = {
    "description": "The caller's X-Request-ID if it was sane, else a generated one.",
    "schema": {"type": "string"},
}


def _response(
    description: str, schema: str | None, headers: dict[str, Any] | None = None
) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "headers": {"X-Request-ID": _REQUEST_ID, **(headers or {})},
    }
    if schema is not None:
        response["content"] = {"application/json": {"schema": {"$ref": _REF + schema}}}
    return response


def _error(description: str) -> dict[str, Any]:
    return _response(description, "Error")


_UNAVAILABLE = _error("The database is unreachable or did not answer in time.")
_FULL = _response(
    "A queue the request adds to holds its MAX_PENDING cap of pending jobs; nothing was "
    "written (a batch is refused whole). A replay of a stored job is still answered 200.",
    "Error",
    {
        "Retry-After": {
            "description": "Seconds to wait before retrying.",
            "schema": {"type": "integer"},
        }
    },
)
_JOB_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "A job id. An unknown or malformed id answers 404.",
}
_WAIT = {
    "name": "wait",
    "in": "query",
    "required": False,
    "description": (
        "Answer once the job is completed, failed, cancelled or dead_letter, or when this "
        f"long has passed (200 with the job either way): more than 0, at most "
        f"{format_duration(MAX_WAIT)}; seconds (30, 2.5) or a Go duration (500ms, 1m)."
    ),
    "schema": {"type": "string", "pattern": DURATION_PATTERN},
}
_STATUS_LIST = "|".join(_STATUSES)


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


_LIST_PARAMETERS = [
    _query(
        "status",
        "One status, or several separated by commas.",
        {"type": "string", "pattern": f"^({_STATUS_LIST})(,({_STATUS_LIST}))*$"},
    ),
    _query(
        "type",
        "Jobs of this type (exact match; need not be registered).",
        {"type": "string", "minLength": 1, **_NO_NUL},
    ),
    _query("queue", "Jobs of this queue.", _QUEUE),
    _query(
        "limit",
        f"Jobs per page (default {DEFAULT_LIMIT}).",
        {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
    ),
    _query(
        "cursor",
        "The next_cursor of the previous page (opaque).",
        {"type": "string", "pattern": CURSOR_PATTERN},
    ),
]
_KEY_SCHEMA = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_KEY_LENGTH,
    "pattern": "^[\\x21-\\x7e]([\\x20-\\x7e]*[\\x21-\\x7e])?$",
    # Reserved for the ticks of periodic schedules.
    "not": {"pattern": "^periodic:"},
}
_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": (
        "Makes the submission safe to repeat: the same key with the same type, payload, "
        "max_attempts, queue, priority, timeout and concurrency_key returns the existing job "
        "(200), whatever its run_at or delay; with a different request, 409. Keys starting "
        "with 'periodic:' are reserved for periodic schedules (400)."
    ),
    "schema": _KEY_SCHEMA,
}


def _paths(auth: bool, admission: bool) -> dict[str, Any]:
    locked: dict[str, Any] = {"security": [{"bearer": []}]} if auth else {}
    unauthorized = {"401": _error("Missing or invalid bearer token.")} if auth else {}
    full = {"429": _FULL} if admission else {}
    job_read = {
        "404": _error("No job has this id."),
        **unauthorized,
        "503": _UNAVAILABLE,
    }
    bad_query = {"400": _error("An unknown, repeated or invalid query parameter.")}
    return {
        "/jobs": {
            "get": {
                "operationId": "listJobs",
                "summary": "List and search jobs, newest first, a page at a time",
                **locked,
                "parameters": _LIST_PARAMETERS,
                "responses": {
                    "200": _response("A page of jobs.", "JobList"),
                    **bad_query,
                    **unauthorized,
                    "503": _UNAVAILABLE,
                },
            },
            "post": {
                "operationId": "createJob",
                "summary": "Submit a job",
                **locked,
                "parameters": [_IDEMPOTENCY_KEY],
                "requestBody": {
                    "required": True,
                    "description": "Read as JSON whatever the Content-Type.",
                    "content": {"application/json": {"schema": {"$ref": _REF + "CreateJob"}}},
                },
                "responses": {
                    "201": _response(
                        "Created.",
                        "Job",
                        {"Location": {"description": "/jobs/{id}", "schema": {"type": "string"}}},
                    ),
                    "200": _response("Idempotent replay: the job this key created.", "Job"),
                    "400": _error("Invalid request (the message says what)."),
                    **unauthorized,
                    "409": _error("The idempotency key was used for a different request."),
                    "413": _error("The body is larger than MAX_BODY_BYTES."),
                    **full,
                    "503": _UNAVAILABLE,
                },
            },
        },
        "/jobs/batch": {
            "post": {
                "operationId": "createJobs",
                "summary": f"Submit 1 to {MAX_BATCH} jobs in one request",
                **locked,
                "requestBody": {
                    "required": True,
                    "description": (
                        "All items are validated first: if any is invalid the answer is 400 "
                        "naming the invalid items and nothing is written. Otherwise all are "
                        "written in one statement. A key repeated within the batch acts like "
                        "sequential submissions."
                    ),
                    "content": {"application/json": {"schema": {"$ref": _REF + "BatchRequest"}}},
                },
                "responses": {
                    "200": _response("Per-item results, in input order.", "BatchResults"),
                    "400": _error("An invalid request or item(s); nothing was written."),
                    **unauthorized,
                    "413": _error("The body is larger than MAX_BODY_BYTES."),
                    **full,
                    "503": _UNAVAILABLE,
                },
            }
        },
        "/jobs/{id}": {
            "get": {
                "operationId": "getJob",
                "summary": "The full job record, at once or once the job has finished",
                **locked,
                "parameters": [_JOB_ID, _WAIT],
                "responses": {
                    "200": _response("The job's full record.", "JobRecord"),
                    **bad_query,
                    **job_read,
                },
            }
        },
        "/jobs/{id}/status": {
            "get": {
                "operationId": "getJobStatus",
                "summary": "Status, attempts, next run time and last error",
                **locked,
                "parameters": [_JOB_ID],
                "responses": {"200": _response("The job's status.", "JobStatus"), **job_read},
            }
        },
        "/jobs/{id}/retry": {
            "post": {
                "operationId": "retryJob",
                "summary": f"Requeue a {_either(Operation.MANUAL_RETRY.sources)} job with "
                "attempts reset to 0",
                **locked,
                "parameters": [_JOB_ID],
                "responses": {
                    "200": _response("The job, pending again.", "Job"),
                    "409": _error(f"The job is not {_either(Operation.MANUAL_RETRY.sources)}."),
                    **job_read,
                },
            }
        },
        "/jobs/{id}/cancel": {
            "post": {
                "operationId": "cancelJob",
                "summary": "Cancel a job: at once if no worker runs it, else ask its worker",
                **locked,
                "parameters": [_JOB_ID],
                "responses": {
                    "200": _response(
                        f"The job was {_either(Operation.CANCEL.sources)}: it is cancelled.",
                        "Job",
                    ),
                    "202": _response(
                        "The job is processing: its worker was asked to stop the attempt "
                        "(cancel_requested_at is set); it ends cancelled unless the attempt "
                        "finishes first. Asking again answers 202 again.",
                        "Job",
                    ),
                    "409": _error("The job is completed, failed or cancelled already."),
                    **job_read,
                },
            }
        },
        "/jobs/cancel": _bulk(
            "cancelJobs",
            "Cancel the jobs a filter matches (running ones: their workers are asked)",
            "BulkCancelled",
            locked,
            unauthorized,
        ),
        "/jobs/retry": _bulk(
            "retryJobs",
            f"Requeue the {_either(Operation.MANUAL_RETRY.sources)} jobs a filter matches",
            "BulkRetried",
            locked,
            unauthorized,
        ),
        "/queues/{queue}/pause": _pause("pauseQueue", "Pause a queue", locked, unauthorized),
        "/queues/{queue}/resume": _pause("resumeQueue", "Resume a queue", locked, unauthorized),
        "/queues": {
            "get": {
                "operationId": "queueDepths",
                "summary": "Each queue's pending, scheduled, processing and dead_letter jobs",
                **locked,
                "responses": {
                    "200": _response("Every queue that holds jobs.", "QueueDepths"),
                    **bad_query,
                    **unauthorized,
                    "503": _UNAVAILABLE,
                },
            }
        },
        "/healthz": {
            "get": {
                "operationId": "health",
                "summary": "Liveness: 200 while the process serves HTTP",
                "responses": {"200": _response("Alive.", "Health")},
            }
        },
        "/readyz": {
            "get": {
                "operationId": "ready",
                "summary": "Readiness: the database takes writes and no shutdown has begun",
                "responses": {
                    "200": _response("Ready.", "Ready"),
                    "503": _error("Not ready (database unavailable or read-only, shutting down)."),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "Prometheus text exposition format.",
                        "headers": {"X-Request-ID": _REQUEST_ID},
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1 document.",
                        "headers": {"X-Request-ID": _REQUEST_ID},
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
    }


def _bulk(
    operation: str, summary: str, answer: str, locked: dict[str, Any], unauthorized: dict[str, Any]
) -> dict[str, Any]:
    return {
        "post": {
            "operationId": operation,
            "summary": summary,
            **locked,
            "requestBody": {
                "required": True,
                "description": "Read as JSON whatever the Content-Type.",
                "content": {"application/json": {"schema": {"$ref": _REF + "BulkFilter"}}},
            },
            "responses": {
                "200": _response("What was done, in batches, each job once.", answer),
                "400": _error("An invalid filter; nothing was changed."),
                **unauthorized,
                "503": _UNAVAILABLE,
            },
        }
    }


def _pause(
    operation: str, summary: str, locked: dict[str, Any], unauthorized: dict[str, Any]
) -> dict[str, Any]:
    return {
        "post": {
            "operationId": operation,
            "summary": f"{summary} (idempotent; any valid queue name, also one without jobs)",
            **locked,
            "parameters": [
                {
                    "name": "queue",
                    "in": "path",
                    "required": True,
                    "schema": _QUEUE,
                    "description": "A queue name; another is 400.",
                }
            ],
            "responses": {
                "200": _response("The queue and whether it is paused now.", "QueuePaused"),
                "400": _error("Not a queue name."),
                **unauthorized,
                "503": _UNAVAILABLE,
            },
        }
    }


def _either(statuses: frozenset[Status]) -> str:
    *others, last = sorted(statuses)
    return f"{', '.join(others)} or {last}" if others else last


def document(
    job_types: list[str], *, auth: bool, default_max_attempts: int, admission: bool = False
) -> dict[str, Any]:
    """With `admission` (MAX_PENDING set), the create endpoints may answer 429."""
    components: dict[str, Any] = {"schemas": _schemas(job_types, default_max_attempts)}
    if auth:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "jobqueue",
            "version": "1",
            "description": (
                'A durable job queue on PostgreSQL. Errors are {"error": "..."}. '
                "Every response carries X-Request-ID (the caller's, if sane, else generated)."
            ),
        },
        "paths": _paths(auth, admission),
        "components": components,
    }
