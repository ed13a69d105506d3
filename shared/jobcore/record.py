"""The job record, declared once: what the API answers for a job (docs/api.md#jobs).

Each field is declared here once, in the order the API writes it: its name (also the
attribute of the row, `jobcore.rows.Job`, it is written from), its kind (its JSON type and
format, how the API writes the row's value and how the client reads it back), whether it
may be null, and what it means. Derived from it: the API's `job_json`, `record_json` and
`status_json` (`jobqueue_api.records`), the Job, JobRecord and JobStatus schemas of its
OpenAPI document (`jobqueue_api.openapi`, which adds the limits the schema puts on values)
and the client's `Job.from_json` (`jobcore.client.records`).

`JOB` is what every answer holding a job carries (lists, submits, cancel, retry);
`JOB_RECORD`, the full record of `GET /jobs/{id}`, adds the failed attempts (`errors`), which
hold up to 20 tracebacks of 8 KiB each: too much for a page of 500 jobs.

It imports nothing beyond `jobcore.states`: the client needs no SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any

from jobcore.states import Status


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


@dataclass(frozen=True)
class Kind:
    """What a field holds: its JSON Schema (type, format), how the API writes a row's value
    that is not None (`write`; None: as it is) and how the client reads a JSON value that is
    not null (`read`; None: as it is). `note` prefixes the field's description."""

    schema: Mapping[str, Any]
    write: Callable[[Any], Any] | None = None
    read: Callable[[Any], Any] | None = None
    note: str = ""


TEXT = Kind({"type": "string"})
INTEGER = Kind({"type": "integer"})
NUMBER = Kind({"type": "number"})
# Any JSON value, null included (jsonb as stored).
JSON = Kind({})
# A UUID in the row, its canonical text in JSON and to the client.
UUID = Kind({"type": "string", "format": "uuid"}, write=str)
TIME = Kind(
    {"type": "string", "format": "date-time"}, timestamp, datetime.fromisoformat, "RFC 3339, UTC"
)
# A status neither side knows (a later release's, during a rollout: docs/upgrading.md) is
# written and read as it is (`Status.read`); the enum lists the statuses of this release.
STATUS = Kind(
    {"type": "string", "enum": [status.value for status in Status]},
    attrgetter("value"),
    Status.read,
)


@dataclass(frozen=True)
class FailedAttempt:
    """One entry of a job's `errors`: attempt number `attempt` failed `at` with `error` (as
    `last_error` says it) and `traceback`, the formatted exception (its last 8 KiB; None
    where nothing raised: an expired lease, a timeout, a type without a handler)."""

    attempt: int
    at: datetime
    error: str
    traceback: str | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FailedAttempt:
        at = datetime.fromisoformat(data["at"])
        return cls(data["attempt"], at, data["error"], data.get("traceback"))


def _write_errors(entries: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`jobs.errors` as the API answers it: each `at` as every other time (RFC 3339, UTC),
    where jsonb holds the database session's rendering."""
    return [
        {
            "attempt": entry["attempt"],
            "at": timestamp(datetime.fromisoformat(entry["at"])),
            "error": entry["error"],
            "traceback": entry["traceback"],
        }
        for entry in entries
    ]


def _read_errors(entries: list[Mapping[str, Any]]) -> tuple[FailedAttempt, ...]:
    return tuple(FailedAttempt.from_json(entry) for entry in entries)


_ENTRY = {
    "type": "object",
    "required": ["attempt", "at", "error", "traceback"],
    "additionalProperties": False,
    "properties": {
        "attempt": {"type": "integer", "description": "The attempt that failed."},
        "at": {
            "type": "string",
            "format": "date-time",
            "description": "RFC 3339, UTC: when its failure was recorded.",
        },
        "error": {"type": "string", "description": "Type: message, as in last_error."},
        "traceback": {
            "type": ["string", "null"],
            "description": "The formatted exception, its last 8 KiB (UTF-8) kept; null where"
            " nothing raised (an expired lease, a timeout in a thread, a type without a"
            " handler).",
        },
    },
}
# The failed attempts, oldest first (`jobs.errors`; an empty list until one fails).
ERRORS = Kind({"type": "array", "items": _ENTRY}, _write_errors, _read_errors)


@dataclass(frozen=True)
class Field:
    """One field of the record. `since`: the schema revision that added it; an API of an
    earlier release leaves it out, and the client reads that as null."""

    name: str
    kind: Kind
    description: str
    nullable: bool = False
    since: str | None = None

    def __post_init__(self) -> None:
        # The API writes it from the row's attribute of this name, in generated code.
        assert self.name.isidentifier(), self.name
        assert self.since is None or self.nullable, f"{self.name}: absent reads as null"

    def read(self, data: Mapping[str, Any]) -> Any:
        """This field's value in a record the API answered, as the client holds it."""
        value = data[self.name] if self.since is None else data.get(self.name)
        if self.kind.read is None or (value is None and self.nullable):
            return value
        return self.kind.read(value)


JOB: tuple[Field, ...] = (
    Field("id", UUID, "The job's id: a time-ordered UUID (version 7)."),
    Field("type", TEXT, "The handler type it runs."),
    Field("payload", JSON, "The JSON value given at submission.", nullable=True),
    Field("status", STATUS, "Where the job stands."),
    Field(
        "attempts",
        INTEGER,
        "The attempts started: a claim adds one, a release gives it back, a retry resets it.",
    ),
    Field(
        "max_attempts",
        INTEGER,
        "The attempts it may start; a failure of the last sends it to dead_letter.",
    ),
    Field("queue", TEXT, "The queue it waits in."),
    Field("priority", INTEGER, "Among due jobs of a queue, higher runs first."),
    Field(
        "concurrency_key",
        TEXT,
        "Its key: jobs of one key share the workers' KEY_CONCURRENCY limit and take turns"
        " with other keys' jobs; null: none.",
        nullable=True,
        since="0011",
    ),
    Field(
        "timeout",
        NUMBER,
        "Seconds per attempt; null: the worker's JOB_TIMEOUT.",
        nullable=True,
    ),
    Field("run_at", TIME, "when it is due (after a retryable failure, the end of its backoff)."),
    Field(
        "last_error",
        TEXT,
        "The last failure's Type: message; null until one, and again once it completes.",
        nullable=True,
    ),
    Field(
        "result",
        JSON,
        "What the handler returned (JSON); null until it completes.",
        nullable=True,
        since="0005",
    ),
    Field(
        "cancel_requested_at",
        TIME,
        "when a cancel of the running attempt was asked.",
        nullable=True,
        since="0005",
    ),
    Field(
        "finished_at",
        TIME,
        "when the job reached completed, failed, dead_letter or cancelled; null before "
        "(and again after a retry).",
        nullable=True,
        since="0005",
    ),
    Field("created_at", TIME, "when it was submitted."),
    Field("updated_at", TIME, "when it last changed."),
)

# The full record (GET /jobs/{id}): the fields above and the failed attempts.
JOB_RECORD: tuple[Field, ...] = (
    *JOB,
    Field(
        "errors",
        ERRORS,
        "The failed attempts, oldest first, the last 20: each attempt's number, when it"
        " failed, its error and traceback; [] until one fails. Only in the full record.",
        nullable=True,
        since="0007",
    ),
)

# The job's status (GET /jobs/{id}/status): these fields of the record, in its order.
JOB_STATUS: tuple[Field, ...] = tuple(
    field
    for field in JOB
    if field.name in {"id", "status", "attempts", "max_attempts", "run_at", "last_error"}
)
