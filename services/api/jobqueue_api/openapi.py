"""The OpenAPI 3.1 document served at `/openapi.json`, built from the live configuration.

Job types come from the handler registry and security from API_TOKENS, so the
document describes exactly what this process accepts.
"""

from __future__ import annotations

from typing import Any

from jobcore.durations import format_duration
from jobcore.schema import MAX_PRIORITY, MAX_TIMEOUT, MIN_PRIORITY, MIN_TIMEOUT, QUEUE_PATTERN
from jobcore.states import Status
from jobqueue_api.validation import (
    DURATION_PATTERN,
    MAX_ATTEMPTS,
    MAX_BATCH,
    MAX_DELAY,
    MAX_DEPTH,
    MAX_KEY_LENGTH,
    MIN_ATTEMPTS,
    MIN_DELAY,
    TIMESTAMP_PATTERN,
)

_REF = "#/components/schemas/"
_TIME = {"type": "string", "format": "date-time", "description": "RFC 3339, UTC"}
_ID = {"type": "string", "format": "uuid"}


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
    }


def _schemas(job_types: list[str], default_max_attempts: int) -> dict[str, Any]:
    status = {"type": "string", "enum": [s.value for s in Status]}
    nullable_text = {"type": ["string", "null"]}
    job = {
        "id": _ID,
        "type": {"type": "string"},
        "payload": {"description": "The JSON value given at submission."},
        "status": status,
        "attempts": {"type": "integer", "minimum": 0},
        "max_attempts": {"type": "integer", "minimum": MIN_ATTEMPTS, "maximum": MAX_ATTEMPTS},
        "queue": _QUEUE,
        "priority": _PRIORITY,
        "timeout": {
            "type": ["number", "null"],
            "minimum": MIN_TIMEOUT,
            "maximum": MAX_TIMEOUT,
            "description": "Seconds per attempt; null: the worker's JOB_TIMEOUT.",
        },
        "run_at": _TIME,
        "last_error": nullable_text,
        "created_at": _TIME,
        "updated_at": _TIME,
    }
    status_fields = ("id", "status", "attempts", "max_attempts", "run_at", "last_error")
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
        "Job": _object(job),
        "JobStatus": _object({name: job[name] for name in status_fields}),
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
        "Payload": _PAYLOAD,
        "Error": _object({"error": {"type": "string"}}),
        "Health": _object({"status": {"type": "string"}}),
    }


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
_KEY_SCHEMA = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_KEY_LENGTH,
    "pattern": "^[\\x21-\\x7e]([\\x20-\\x7e]*[\\x21-\\x7e])?$",
}
_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": (
        "Makes the submission safe to repeat: the same key with the same type, payload, "
        "max_attempts, queue, priority and timeout returns the existing job (200), whatever "
        "its run_at or delay; with a different request, 409."
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
    return {
        "/jobs": {
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
            }
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
                "summary": "The full job record",
                **locked,
                "parameters": [_JOB_ID],
                "responses": {"200": _response("The job.", "Job"), **job_read},
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
                "summary": "Requeue a dead-lettered or failed job with attempts reset to 0",
                **locked,
                "parameters": [_JOB_ID],
                "responses": {
                    "200": _response("The job, pending again.", "Job"),
                    "409": _error("The job is not in dead_letter or failed."),
                    **job_read,
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
                "summary": "Readiness: the database answers and the process is not shutting down",
                "responses": {
                    "200": _response("Ready.", "Health"),
                    "503": _error("Not ready (database unavailable, or shutting down)."),
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
