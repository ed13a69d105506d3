"""@handler's options, its signature check and the Task it returns: the options are checked
as a create request's fields, a function that cannot take (payload, ctx) is refused naming
it, and the Task is the function plus `submit` and `enqueue` with the options as defaults."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from jobcore import JobContext, Task, handler
from jobcore.client import Client
from jobcore.registry import HandlerOptions, HandlerOptionsError, HandlerSignatureError
from jobcore.schema import jobs


@handler("test.task.receipt", queue="mail", priority=5, max_attempts=3, timeout="1m")
async def send_receipt(payload: Any, ctx: JobContext) -> dict[str, Any]:
    return {"sent": payload["order"]}


@handler("test.task.plain", priority=-7)
def plain(payload: Any, ctx: JobContext) -> str:
    return f"plain {payload}"


def test_options_are_checked_and_kept_as_create_fields():
    assert send_receipt.options == HandlerOptions("mail", 5, 3, 60.0)
    assert send_receipt.options.fields() == {
        "queue": "mail",
        "priority": 5,
        "max_attempts": 3,
        "timeout": 60.0,
    }
    assert plain.options.fields() == {"priority": -7}


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"queue": "Mail!"}, "option 'queue' must be 1 to 63 characters"),
        ({"priority": 101}, "option 'priority' must be an integer from -100 to 100"),
        ({"max_attempts": 0}, "option 'max_attempts' must be an integer from 1 to 100"),
        ({"timeout": "0.5s"}, "option 'timeout' must be a duration from 1s to 24h"),
        ({"timeout": "soon"}, "option 'timeout' must be a duration"),
    ],
)
def test_an_invalid_option_is_refused_when_declared_with_the_create_rules_message(options, says):
    with pytest.raises(HandlerOptionsError, match=says) as caught:
        handler("test.task.invalid", **options)
    assert "handler 'test.task.invalid'" in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_a_function_that_cannot_take_payload_and_ctx_is_a_type_error_naming_it():
    def one_argument(payload):  # type: ignore[no-untyped-def]
        return None

    with pytest.raises(TypeError) as caught:
        handler("test.task.bad-signature")(one_argument)
    assert isinstance(caught.value, HandlerSignatureError)
    message = str(caught.value)
    assert "'test.task.bad-signature'" in message and "one_argument" in message
    assert "fn(payload, ctx)" in message

    def keyword_only(*, payload, ctx):  # type: ignore[no-untyped-def]
        return None

    with pytest.raises(HandlerSignatureError, match="keyword_only"):
        handler("test.task.bad-signature")(keyword_only)


def test_functions_that_take_more_optional_arguments_or_varargs_are_fine():
    @handler("test.task.flexible")
    def flexible(payload, ctx, extra=1, *rest, **named):  # type: ignore[no-untyped-def]
        return extra

    @handler("test.task.varargs")
    async def varargs(*args):  # type: ignore[no-untyped-def]
        return len(args)

    assert flexible({}, None) == 1
    assert asyncio.run(varargs(1, 2)) == 2


def test_the_task_is_still_callable_as_the_function_sync_and_async():
    assert isinstance(send_receipt, Task) and isinstance(plain, Task)
    assert send_receipt.type == "test.task.receipt" and send_receipt.__name__ == "send_receipt"
    assert plain("x", None) == "plain x"  # type: ignore[arg-type]
    assert asyncio.run(send_receipt({"order": 7}, None)) == {"sent": 7}  # type: ignore[arg-type]


def test_the_same_type_with_other_options_is_refused():
    async def fn(payload: Any, ctx: JobContext) -> None:
        return None

    handler("test.task.once", priority=1)(fn)
    handler("test.task.once", priority=1)(fn)  # the same declaration again is fine
    with pytest.raises(ValueError, match="already registered with other options"):
        handler("test.task.once", priority=2)(fn)


def _stored(database_url: str, job_id: Any) -> dict[str, Any]:
    engine = sa.create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            row = conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).mappings().one()
            return dict(row)
    finally:
        engine.dispose()


def test_enqueue_applies_the_options_and_explicit_fields_win(database_url):
    engine = sa.create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as conn:
            defaulted = send_receipt.enqueue(conn, {"order": 1})
            explicit = send_receipt.enqueue(conn, {"order": 2}, queue="other", priority=0)
    finally:
        engine.dispose()
    row = _stored(database_url, defaulted)
    assert (row["queue"], row["priority"], row["max_attempts"], row["timeout"]) == (
        "mail",
        5,
        3,
        60.0,
    )
    row = _stored(database_url, explicit)
    assert (row["queue"], row["priority"], row["max_attempts"]) == ("other", 0, 3)


def test_submit_sends_the_options_as_fields_through_the_client():
    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        import json

        body = json.loads(request.content)
        sent.append(body)
        return httpx.Response(201, json=_record(body))

    client = Client("http://api", transport=httpx.MockTransport(answer))
    with client:
        job = send_receipt.submit({"order": 3}, client=client, priority=9)
    assert sent == [
        {
            "type": "test.task.receipt",
            "payload": {"order": 3},
            "queue": "mail",
            "priority": 9,
            "max_attempts": 3,
            "timeout": 60.0,
        }
    ]
    assert job.type == "test.task.receipt" and job.priority == 9


def _record(body: dict[str, Any]) -> dict[str, Any]:
    now = "2026-01-01T00:00:00Z"
    return {
        "id": "0190a000-0000-7000-8000-000000000001",
        "type": body["type"],
        "payload": body.get("payload", {}),
        "status": "pending",
        "attempts": 0,
        "max_attempts": body.get("max_attempts", 5),
        "run_at": now,
        "last_error": None,
        "created_at": now,
        "updated_at": now,
        "queue": body.get("queue", "default"),
        "priority": body.get("priority", 0),
        "timeout": body.get("timeout"),
        "result": None,
        "cancel_requested_at": None,
        "finished_at": None,
    }
