"""The job record is declared once (`jobcore.record`): the API's JSON, the OpenAPI document
and the client's `Job` are all derived from it, and the JSON is what the API always wrote."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone
from uuid import UUID

from jobcore import record
from jobcore.client import records as client
from jobcore.record import timestamp
from jobcore.rows import Job
from jobcore.states import FINISHED, Status
from jobqueue_api import jsonio, openapi
from jobqueue_api.records import job_json, record_json, status_json

NOW = datetime(2026, 11, 30, 4, 19, 49, 82038, tzinfo=UTC)
ID = UUID("01a22aae-32d0-7c31-b68d-fb41a7ea06d6")

# Every field set, of every kind.
FINISHED_JOB = Job(
    id=ID,
    type="webhook",
    payload={"url": "https://example.com/hook", "tries": [1, 2], "note": "é"},
    status=Status.COMPLETED,
    attempts=2,
    max_attempts=5,
    run_at=NOW,
    locked_until=None,
    lease_token=3,
    last_error="TimeoutError: read timed out",
    idempotency_key="order-42",
    created_at=NOW - timedelta(seconds=5),
    updated_at=NOW + timedelta(seconds=1),
    queue="mail",
    priority=-3,
    concurrency_key="tenant é/7",
    timeout=30.5,
    result={"status": 204},
    # Not UTC, and one with no microseconds: both written in UTC with six digits.
    cancel_requested_at=NOW.astimezone(timezone(timedelta(hours=5, minutes=30))),
    finished_at=NOW.replace(microsecond=0),
    # As jsonb holds it: `at` in the database session's rendering.
    errors=[
        {
            "attempt": 1,
            "at": "2026-11-30T09:49:45.5+05:30",
            "error": "TimeoutError: read timed out",
            "traceback": 'Traceback (most recent call last):\n  File "h.py", line 3, in run\n',
        },
        {
            "attempt": 2,
            "at": "2026-11-30T04:19:46+00:00",
            "error": "lease expired",
            "traceback": None,
        },
    ],
)
FINISHED_JSON = (
    b'{"id":"01a22aae-32d0-7c31-b68d-fb41a7ea06d6","type":"webhook",'
    b'"payload":{"url":"https://example.com/hook","tries":[1,2],"note":"\xc3\xa9"},'
    b'"status":"completed","attempts":2,"max_attempts":5,"queue":"mail","priority":-3,'
    b'"concurrency_key":"tenant \xc3\xa9/7","timeout":30.5,"run_at":"2026-11-30T04:19:49.082038Z",'
    b'"last_error":"TimeoutError: read timed out","result":{"status":204},'
    b'"cancel_requested_at":"2026-11-30T04:19:49.082038Z",'
    b'"finished_at":"2026-11-30T04:19:49.000000Z","created_at":"2026-11-30T04:19:44.082038Z",'
    b'"updated_at":"2026-11-30T04:19:50.082038Z"}'
)

# Every nullable field null: a fresh submission.
PENDING_JOB = dataclasses.replace(
    FINISHED_JOB,
    type="sleep",
    payload=None,
    status=Status.PENDING,
    attempts=0,
    last_error=None,
    created_at=NOW,
    updated_at=NOW,
    queue="default",
    priority=0,
    concurrency_key=None,
    timeout=None,
    result=None,
    cancel_requested_at=None,
    finished_at=None,
)
PENDING_JSON = (
    b'{"id":"01a22aae-32d0-7c31-b68d-fb41a7ea06d6","type":"sleep","payload":null,'
    b'"status":"pending","attempts":0,"max_attempts":5,"queue":"default","priority":0,'
    b'"concurrency_key":null,"timeout":null,"run_at":"2026-11-30T04:19:49.082038Z","last_error":null,"result":null,'
    b'"cancel_requested_at":null,"finished_at":null,"created_at":"2026-11-30T04:19:49.082038Z",'
    b'"updated_at":"2026-11-30T04:19:49.082038Z"}'
)

NAMES = [field.name for field in record.JOB]
RECORD_NAMES = [*NAMES, "errors"]
STATUS_NAMES = ["id", "status", "attempts", "max_attempts", "run_at", "last_error"]


def test_job_json_writes_exactly_what_the_api_always_wrote():
    assert jsonio.dumps(job_json(FINISHED_JOB)) == FINISHED_JSON
    assert jsonio.dumps(job_json(PENDING_JOB)) == PENDING_JSON


def test_status_json_writes_exactly_what_the_api_always_wrote():
    assert jsonio.dumps(status_json(FINISHED_JOB)) == (
        b'{"id":"01a22aae-32d0-7c31-b68d-fb41a7ea06d6","status":"completed","attempts":2,'
        b'"max_attempts":5,"run_at":"2026-11-30T04:19:49.082038Z",'
        b'"last_error":"TimeoutError: read timed out"}'
    )
    assert jsonio.dumps(status_json(PENDING_JOB)) == (
        b'{"id":"01a22aae-32d0-7c31-b68d-fb41a7ea06d6","status":"pending","attempts":0,'
        b'"max_attempts":5,"run_at":"2026-11-30T04:19:49.082038Z","last_error":null}'
    )


def test_a_status_this_release_does_not_know_is_written_as_it_is():
    later = Status.read("paused")
    written = job_json(dataclasses.replace(PENDING_JOB, status=later))
    assert written["status"] == "paused" and jsonio.dumps(written).count(b'"paused"') == 1


def test_the_json_the_document_and_the_client_have_exactly_the_declared_fields_in_order():
    assert len(set(NAMES)) == len(NAMES)
    assert list(job_json(FINISHED_JOB)) == NAMES
    assert list(job_json(PENDING_JOB)) == NAMES
    assert [field.name for field in record.JOB_STATUS] == STATUS_NAMES
    assert list(status_json(FINISHED_JOB)) == STATUS_NAMES
    schemas = openapi.document(["sleep"], auth=False, default_max_attempts=5)["components"][
        "schemas"
    ]
    assert [field.name for field in record.JOB_RECORD] == RECORD_NAMES
    assert list(record_json(FINISHED_JOB)) == RECORD_NAMES
    for schema, names in (("Job", NAMES), ("JobRecord", RECORD_NAMES), ("JobStatus", STATUS_NAMES)):
        assert list(schemas[schema]["properties"]) == names
        assert schemas[schema]["required"] == names
        assert schemas[schema]["additionalProperties"] is False
    assert [f.name for f in dataclasses.fields(client.Job)] == [*RECORD_NAMES, "raw"]
    # Each is written from the row's attribute of the same name; the limits the document
    # adds are of declared fields.
    assert set(RECORD_NAMES) <= {f.name for f in dataclasses.fields(Job)}
    assert set(openapi._LIMITS) <= set(NAMES)


def test_the_documents_job_schema_says_each_fields_kind_and_whether_it_may_be_null():
    job = openapi.document(["sleep"], auth=False, default_max_attempts=5)["components"]["schemas"][
        "Job"
    ]["properties"]
    assert job["id"] == {
        "type": "string",
        "format": "uuid",
        "description": "The job's id: a time-ordered UUID (version 7).",
    }
    assert job["status"]["enum"] == [status.value for status in Status]
    assert job["run_at"]["type"] == "string" and job["run_at"]["format"] == "date-time"
    assert job["finished_at"]["type"] == ["string", "null"]
    assert job["finished_at"]["description"].startswith("RFC 3339, UTC: when the job reached")
    assert job["last_error"]["type"] == ["string", "null"]
    assert job["timeout"]["type"] == ["number", "null"]
    assert (job["max_attempts"]["minimum"], job["max_attempts"]["maximum"]) == (1, 100)
    assert "type" not in job["payload"] and "type" not in job["result"]  # any JSON
    assert all(property["description"] for property in job.values())


def test_the_client_reads_back_what_job_json_wrote():
    for row in (FINISHED_JOB, PENDING_JOB):
        data = jsonio.loads(jsonio.dumps(job_json(row)))
        read = client.Job.from_json(data)
        for name in NAMES:
            value = getattr(row, name)
            assert getattr(read, name) == (str(value) if name == "id" else value), name
        assert read.raw is data
        assert read.status is row.status
        assert read.finished is (row.status in FINISHED)


def test_the_full_record_writes_the_failed_attempts_with_times_in_utc():
    assert record_json(FINISHED_JOB)["errors"] == [
        {
            "attempt": 1,
            "at": "2026-11-30T04:19:45.500000Z",
            "error": "TimeoutError: read timed out",
            "traceback": 'Traceback (most recent call last):\n  File "h.py", line 3, in run\n',
        },
        {
            "attempt": 2,
            "at": "2026-11-30T04:19:46.000000Z",
            "error": "lease expired",
            "traceback": None,
        },
    ]
    assert record_json(dataclasses.replace(FINISHED_JOB, errors=[]))["errors"] == []
    # Lists and the other answers leave them out.
    assert "errors" not in job_json(FINISHED_JOB)


def test_the_client_reads_the_failed_attempts_of_the_full_record_and_none_elsewhere():
    read = client.Job.from_json(jsonio.loads(jsonio.dumps(record_json(FINISHED_JOB))))
    assert read.errors == (
        client.FailedAttempt(
            1,
            NOW - timedelta(seconds=3, microseconds=582038),
            "TimeoutError: read timed out",
            'Traceback (most recent call last):\n  File "h.py", line 3, in run\n',
        ),
        client.FailedAttempt(
            2, NOW.replace(microsecond=0) - timedelta(seconds=3), "lease expired", None
        ),
    )
    assert client.Job.from_json(jsonio.loads(jsonio.dumps(job_json(FINISHED_JOB)))).errors is None


def test_the_client_reads_a_later_releases_status_and_an_earlier_releases_missing_fields():
    data = jsonio.loads(jsonio.dumps(job_json(PENDING_JOB)))
    data["status"] = "paused"
    for name in ("result", "cancel_requested_at", "finished_at"):  # added by 0005
        del data[name]
    del data["concurrency_key"]  # added by 0011
    read = client.Job.from_json(data)
    assert read.status == "paused" and not read.finished
    assert (read.result, read.cancel_requested_at, read.finished_at) == (None, None, None)
    assert read.concurrency_key is None
    assert {field.name for field in record.JOB_RECORD if field.since} == {
        "result",
        "cancel_requested_at",
        "finished_at",
        "errors",
        "concurrency_key",
    }


def test_timestamps_are_rfc3339_in_utc_with_microseconds():
    assert timestamp(None) is None
    assert timestamp(NOW) == "2026-11-30T04:19:49.082038Z"
    assert timestamp(NOW.replace(microsecond=0)) == "2026-11-30T04:19:49.000000Z"
    assert timestamp(NOW.astimezone(timezone(timedelta(hours=-8)))) == timestamp(NOW)
    assert datetime.fromisoformat(timestamp(NOW) or "") == NOW
