"""`jobcore.client.Client` against a real `jobqueue-api` and worker: every call, every typed
error, and retries that never create a second job."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from jobcore.client import (
    MAX_BATCH,
    Client,
    ClientError,
    Conflict,
    Invalid,
    Job,
    NotFound,
    RateLimited,
    Retries,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from jobcore.client import retries as retries_module
from jobcore.states import Status
from tests.faultproxy import FaultProxy
from tests.jobcore.client.conftest import LATE, PATIENT, TOKEN, WAIT, Stack, polls_end_in_time
from tests.procs import free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("jobcore_client")]

FAST = Retries(attempts=4, total=10.0, base=0.05, cap=0.2)


@pytest.fixture
def client(stack: Stack) -> Any:
    with Client(stack.url, TOKEN, retries=FAST) as client:
        yield client


def test_submit_returns_the_record_and_a_repeated_key_returns_the_same_job(
    client: Client, stack: Stack, queue: str
):
    job = client.submit(
        "sleep",
        {"duration": "1s"},
        idempotency_key=f"{queue}-a",
        queue=queue,
        priority=5,
        max_attempts=2,
        timeout=timedelta(seconds=90),
        run_at=datetime(2100, 1, 1, tzinfo=UTC),
    )
    assert isinstance(job, Job)
    assert (job.type, job.payload, job.status, job.queue) == (
        "sleep",
        {"duration": "1s"},
        "pending",
        queue,
    )
    assert (job.priority, job.max_attempts, job.timeout) == (5, 2, 90.0)
    assert job.run_at == datetime(2100, 1, 1, tzinfo=UTC)
    assert job.raw["id"] == job.id and not job.finished
    again = client.submit(
        "sleep",
        {"duration": "1s"},
        idempotency_key=f"{queue}-a",
        queue=queue,
        priority=5,
        max_attempts=2,
        timeout=90,
    )
    assert again == job
    with pytest.raises(Conflict) as conflict:
        client.submit("sleep", {"duration": "2s"}, idempotency_key=f"{queue}-a", queue=queue)
    assert conflict.value.status == 409 and "was already used" in conflict.value.message
    assert stack.jobs_in(queue) == 1


def test_every_submit_carries_a_key_so_identical_submissions_stay_distinct_jobs(
    client: Client, stack: Stack, queue: str
):
    first = client.submit("sleep", {"duration": "1s"}, queue=queue)
    second = client.submit("sleep", {"duration": "1s"}, queue=queue)
    assert first.id != second.id
    keys = stack.count(
        "SELECT count(DISTINCT idempotency_key) FROM jobqueue.jobs WHERE queue = %s", queue
    )
    assert keys == 2


def test_bad_input_raises_invalid_with_the_apis_message_and_writes_nothing(
    client: Client, stack: Stack, queue: str
):
    with pytest.raises(Invalid) as unknown:
        client.submit("no.such.type", queue=queue)
    assert (
        unknown.value.status == 400 and "unknown job type 'no.such.type'" in unknown.value.message
    )
    assert unknown.value.request_id
    with pytest.raises(Invalid, match="field 'priority' must be an integer"):
        client.submit("sleep", queue=queue, priority=1000)
    with pytest.raises(Invalid, match="the job is not JSON") as local:
        client.submit("sleep", {"at": datetime.now()}, queue=queue)
    assert local.value.status is None  # refused before any request
    assert isinstance(local.value, ValueError)
    assert stack.jobs_in(queue) == 0


def test_a_concurrency_key_is_submitted_read_back_and_compared_on_a_replay(
    client: Client, stack: Stack, queue: str
):
    job = client.submit("sleep", queue=queue, concurrency_key="tenant-7", idempotency_key=queue)
    assert job.concurrency_key == "tenant-7" and job.raw["concurrency_key"] == "tenant-7"
    assert client.get(job.id).concurrency_key == "tenant-7"
    assert client.submit("sleep", queue=queue).concurrency_key is None
    again = client.submit("sleep", queue=queue, concurrency_key="tenant-7", idempotency_key=queue)
    assert again.id == job.id
    with pytest.raises(Conflict):
        client.submit("sleep", queue=queue, concurrency_key="tenant-8", idempotency_key=queue)
    results = client.submit_many(
        [
            {"type": "sleep", "queue": queue, "concurrency_key": "a"},
            {"type": "sleep", "queue": queue},
            {"type": "sleep", "queue": queue, "concurrency_key": "x", "idempotency_key": queue},
        ]
    )
    assert [r.status for r in results] == ["created", "created", "conflict"]
    assert [client.get(r.id or "").concurrency_key for r in results[:2]] == ["a", None]
    with pytest.raises(Invalid, match="field 'concurrency_key' must be 1 to 255 characters"):
        client.submit("sleep", queue=queue, concurrency_key="")
    assert stack.jobs_in(queue) == 4


def test_get_answers_the_record_and_not_found_names_the_job(client: Client, queue: str):
    job = client.submit("sleep", queue=queue)
    assert client.get(job.id) == dataclasses.replace(job, errors=())  # the full record
    assert job.errors is None  # a submit's answer leaves them out
    missing = "01a22aae-32d0-7c31-b68d-fb41a7ea06d6"
    with pytest.raises(NotFound) as raised:
        client.get(missing)
    assert (raised.value.status, raised.value.job_id) == (404, missing)
    with pytest.raises(NotFound):
        client.get("not-an-id/../../queues")


def test_wait_returns_the_record_once_the_job_has_finished(client: Client):
    job = client.submit("sleep", {"duration": "0.3s"})
    seen: list[Job] = []
    done = client.wait(job.id, timeout=30, progress=seen.append)
    assert done.status == Status.COMPLETED and done.finished
    assert done.finished_at is not None and done.attempts == 1
    assert all(not record.finished for record in seen)

    failed = client.wait(client.submit("test.permanent").id, timeout=30)
    assert failed.status == Status.FAILED and "can never succeed" in (failed.last_error or "")


def test_wait_raises_wait_timeout_with_the_job_as_last_seen(client: Client, queue: str):
    job = client.submit("sleep", queue=queue)
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as raised:
        client.wait(job.id, timeout=0.5)
    assert 0.5 <= time.monotonic() - started < 5
    assert raised.value.job.status == Status.PENDING and raised.value.job_id == job.id
    with pytest.raises(WaitTimeout):
        client.wait(job.id, timeout=0)
    with pytest.raises(NotFound):
        client.wait("01a22aae-32d0-7c31-b68d-fb41a7ea06d6", timeout=5)


def test_cancel_and_retry_move_the_job_and_refuse_from_the_wrong_status(client: Client, queue: str):
    job = client.submit("sleep", queue=queue)
    cancelled = client.cancel(job.id)
    assert cancelled.status == Status.CANCELLED and cancelled.finished_at is not None
    with pytest.raises(Conflict, match="is cancelled") as again:
        client.cancel(job.id)
    assert again.value.job_id == job.id
    retried = client.retry(job.id)
    assert (retried.status, retried.attempts, retried.finished_at) == (Status.PENDING, 0, None)
    with pytest.raises(Conflict, match="is pending"):
        client.retry(job.id)
    with pytest.raises(NotFound):
        client.cancel("01a22aae-32d0-7c31-b68d-fb41a7ea06d6")


def test_cancel_of_a_running_job_is_requested_and_the_worker_stops_it(client: Client):
    job = client.submit("test.block", {"block_attempts": 5})
    wait_for(lambda: client.get(job.id).status == Status.PROCESSING, 20, "the job to start")
    requested = client.cancel(job.id)
    assert requested.status == Status.PROCESSING and requested.cancel_requested_at is not None
    assert client.wait(job.id, timeout=20).status == Status.CANCELLED


def test_list_iterates_over_every_page_newest_first_with_filters(client: Client, queue: str):
    ids = [client.submit("sleep", {"n": n}, queue=queue).id for n in range(7)]
    listed = list(client.list(queue=queue, page_size=3))
    assert [job.id for job in listed] == ids[::-1]
    client.cancel(ids[2])
    assert [job.id for job in client.list(status="cancelled", queue=queue)] == [ids[2]]
    both = client.list(status=["pending", "cancelled"], type="sleep", queue=queue, page_size=500)
    assert len(list(both)) == 7
    with pytest.raises(Invalid, match="unknown status 'nope'"):
        list(client.list(status="nope"))


def test_queues_shows_the_depths_of_each_queue(client: Client, queue: str):
    for _ in range(3):
        client.submit("sleep", queue=queue)
    client.submit("sleep", queue=queue, delay="1h")
    (depth,) = [depth for depth in client.queues() if depth.queue == queue]
    assert (depth.pending, depth.scheduled, depth.processing, depth.dead_letter) == (3, 1, 0, 0)
    assert depth.oldest_pending_age_seconds >= 0


def test_submit_many_goes_in_batches_of_the_apis_limit_and_reports_each_item(
    client: Client, stack: Stack, queue: str
):
    items = [{"type": "sleep", "payload": {"i": i}, "queue": queue} for i in range(MAX_BATCH + 5)]
    items[3]["idempotency_key"] = f"{queue}-3"
    results = client.submit_many(items)
    assert [r.status for r in results] == ["created"] * len(items)
    assert len({r.id for r in results}) == len(items) == stack.jobs_in(queue)
    assert results[3].idempotency_key == f"{queue}-3"

    again = client.submit_many([items[3], {**items[4], "idempotency_key": f"{queue}-3"}])
    assert [(r.status, r.id) for r in again] == [("replayed", results[3].id), ("conflict", None)]
    assert "was already used" in (again[1].error or "")
    assert client.submit_many([]) == []

    bad = [{"type": "sleep", "queue": queue}] * MAX_BATCH + [{"type": "sleep", "queue": "Bad"}]
    with pytest.raises(Invalid, match=r"items 1000 to 1000 .*\[0\] field 'queue'"):
        client.submit_many(bad)
    assert stack.jobs_in(queue) == len(items) + MAX_BATCH  # the first batch went through


def test_a_wrong_token_is_unauthorized_and_the_environment_supplies_url_and_token(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
):
    with Client(stack.url, "wrong", retries=FAST) as client, pytest.raises(Unauthorized):
        client.queues()
    monkeypatch.setenv("JOBQUEUE_URL", stack.url + "/")
    monkeypatch.setenv("JOBQUEUE_TOKEN", TOKEN)
    with Client(retries=FAST) as client:
        assert client.url == stack.url
        assert isinstance(client.queues(), list)


def test_an_unreachable_api_is_unavailable_after_bounded_tries():
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    client = Client(url, retries=Retries(attempts=3, base=0.05, cap=0.1))
    with client, pytest.raises(Unavailable, match=r"cannot reach .* \(3 tries\)") as raised:
        client.get("01a22aae-32d0-7c31-b68d-fb41a7ea06d6")
    assert raised.value.status is None
    assert time.monotonic() - started < 5
    started = time.monotonic()
    client = Client(url, retries=Retries(attempts=1000, total=1.0, base=0.1, cap=0.2))
    with client, pytest.raises(Unavailable):
        client.queues()
    assert time.monotonic() - started < 3  # the total time bounds it, not the attempts


def test_a_connection_cut_after_the_request_reached_the_api_creates_exactly_one_job(
    stack: Stack, queue: str
):
    with FaultProxy(("127.0.0.1", stack.api.port)) as proxy:
        with Client(f"http://127.0.0.1:{proxy.port}", TOKEN, retries=FAST) as client:
            proxy.add_latency(0.5)  # each way: the answer is held 0.5 s after the commit
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                future = pool.submit(client.submit, "sleep", {"duration": "1s"}, queue=queue)
                wait_for(lambda: stack.jobs_in(queue) == 1, 10, "the job to be written", 0.01)
                proxy.cut()
                proxy.pass_through()
                job = future.result(30)
        assert proxy.accepted >= 2  # the client connected again and retried
    assert stack.jobs_in(queue) == 1
    assert stack.count("SELECT count(*) FROM jobqueue.jobs WHERE id = %s", job.id) == 1


def test_a_batch_retried_after_a_cut_connection_creates_each_job_once(stack: Stack, queue: str):
    items = [{"type": "sleep", "queue": queue, "payload": {"i": i}} for i in range(50)]
    with FaultProxy(("127.0.0.1", stack.api.port)) as proxy:
        with Client(f"http://127.0.0.1:{proxy.port}", TOKEN, retries=FAST) as client:
            proxy.add_latency(0.5)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                future = pool.submit(client.submit_many, items)
                wait_for(lambda: stack.jobs_in(queue) == 50, 10, "the batch to be written", 0.01)
                proxy.cut()
                proxy.pass_through()
                results = future.result(30)
        assert proxy.accepted >= 2
    # The retry was a replay of keys this call made: reported as the jobs it created.
    assert [r.status for r in results] == ["created"] * 50
    assert stack.jobs_in(queue) == 50


def _cut_once_applied(stack: Stack, call: Any, job_id: Any, target: str) -> Any:
    """Run `call(job_id)` through a fault proxy and cut the connection once the database
    shows the job `target` (the request was applied, its answer not yet sent); the future."""
    with FaultProxy(("127.0.0.1", stack.api.port)) as proxy:
        with Client(f"http://127.0.0.1:{proxy.port}", TOKEN, retries=FAST) as slow:
            proxy.add_latency(0.5)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                future = pool.submit(getattr(slow, call), job_id)
                wait_for(
                    lambda: stack.count(
                        "SELECT count(*) FROM jobqueue.jobs WHERE id = %s AND status = %s",
                        job_id,
                        target,
                    ),
                    10,
                    f"the job to be {target}",
                    0.01,
                )
                proxy.cut()
                proxy.pass_through()
                concurrent.futures.wait([future], 30)
        return future, proxy.accepted


def test_a_cancel_whose_answer_was_lost_returns_the_job_it_cancelled(
    client: Client, stack: Stack, queue: str
):
    job = client.submit("sleep", queue=queue)
    future, accepted = _cut_once_applied(stack, "cancel", job.id, "cancelled")
    moved = future.result()
    assert accepted >= 2
    # The retried request answered 409 (the job had moved already): the client read it back.
    assert moved.id == job.id and moved.status == "cancelled"


def test_a_retry_whose_answer_was_lost_is_not_sent_again(client: Client, stack: Stack, queue: str):
    job = client.submit("sleep", queue=queue)
    client.cancel(job.id)
    future, accepted = _cut_once_applied(stack, "retry", job.id, "pending")
    with pytest.raises(Unavailable, match="may or may not have been applied"):
        future.result()
    assert accepted == 1  # not sent again: had the job failed meanwhile, it would run twice
    assert client.get(job.id).status == "pending"


def test_a_retry_answered_503_is_not_sent_again_but_a_get_is(
    client: Client, scripted: Any, queue: str
):
    record = _record(client, queue)
    error = b'{"error":"database unavailable"}'
    unavailable = (503, {"Retry-After": "0"}, error)
    server = scripted(unavailable, unavailable, (200, {}, record))
    with Client(server.url, retries=Retries(attempts=3, base=0.01, cap=0.02)) as fast:
        with pytest.raises(Unavailable, match="database unavailable"):
            fast.retry(json.loads(record)["id"])
        assert len(server.times) == 1
        assert fast.get(json.loads(record)["id"]).raw == json.loads(record)  # 503, then 200
    assert len(server.times) == 3


def test_the_time_allowed_for_retries_counts_from_the_first_failure(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(retries_module.time, "monotonic", lambda: now[0])
    flow = retries_module.send(
        retries_module.Request("GET", "/jobs/x", params={"wait": "60"}),
        Retries(attempts=3, total=5.0, base=0.01, cap=0.02),
        "http://api",
    )
    assert isinstance(next(flow), retries_module.Request)
    now[0] += 45.0  # a long poll broke 45 s into its wait, past `total` from its start
    retried = flow.send(httpx.ReadError("reset"))
    assert isinstance(retried, retries_module.Sleep)  # tried again all the same


def _record(client: Client, queue: str) -> bytes:
    """A real job record of the API, for the scripted server to answer with."""
    return json.dumps(dict(client.submit("sleep", queue=queue).raw)).encode()


def test_503_and_429_are_retried_no_sooner_than_retry_after_with_the_same_key(
    client: Client, scripted: Any, queue: str
):
    record = _record(client, queue)
    error = b'{"error":"database unavailable"}'
    server = scripted((503, {"Retry-After": "1"}, error), (201, {}, record))
    with Client(server.url, retries=Retries(attempts=3, base=0.01, cap=0.02)) as fast:
        job = fast.submit("sleep")
    assert job.raw == json.loads(record)
    assert len(server.times) == 2 and server.times[1] - server.times[0] >= 1.0
    keys = [headers["Idempotency-Key"] for headers in server.headers]
    assert keys[0] == keys[1] and keys[0].startswith("jqc-")

    # An HTTP date has whole seconds: 3 s ahead is at least 2 s ahead once truncated.
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=3), usegmt=True)
    full = b'{"error":"queue is full"}'
    server = scripted((429, {"Retry-After": later}, full), (201, {}, record))
    with Client(server.url, retries=Retries(attempts=3, base=0.01, cap=0.02)) as fast:
        fast.submit("sleep")
    assert len(server.times) == 2 and server.times[1] - server.times[0] >= 1.0


def test_retries_end_after_the_attempts_or_when_retry_after_exceeds_the_time_left(
    scripted: Any,
):
    server = scripted((503, {"Retry-After": "0"}, b'{"error":"database unavailable"}'))
    fast = Client(server.url, retries=Retries(attempts=3, base=0.01, cap=0.02))
    with fast, pytest.raises(Unavailable, match="database unavailable") as raised:
        fast.queues()
    assert len(server.times) == 3
    assert (raised.value.status, raised.value.retry_after) == (503, 0.0)

    server = scripted((429, {"Retry-After": "120"}, b'{"error":"queue is full"}'))
    started = time.monotonic()
    fast = Client(server.url, retries=Retries(attempts=5, total=30))
    with fast, pytest.raises(RateLimited) as limited:
        fast.submit("sleep")
    assert time.monotonic() - started < 5 and len(server.times) == 1
    assert limited.value.retry_after == 120.0


def test_a_url_without_http_is_refused_at_once():
    with pytest.raises(ValueError, match="must start with http"):
        Client("localhost:8080")


def test_an_answer_that_is_not_the_apis_json_is_a_client_error_with_its_text(scripted: Any):
    server = scripted((502, {"Content-Type": "text/html"}, b"<html>Bad Gateway</html>"))
    with Client(server.url, retries=FAST) as client, pytest.raises(ClientError) as raised:
        client.get("01a22aae-32d0-7c31-b68d-fb41a7ea06d6")
    assert type(raised.value) is ClientError and raised.value.status == 502
    assert "Bad Gateway" in raised.value.message and len(server.times) == 1  # not retried
    server = scripted((200, {"Content-Type": "text/plain"}, b"hello"))
    with Client(server.url, retries=FAST) as client, pytest.raises(ClientError, match="hello"):
        client.queues()


@pytest.mark.parametrize("mode", ["drop", "stall"])
@pytest.mark.parametrize("answered", [1, 0])
def test_a_wait_whose_long_polls_break_ends_at_its_timeout(
    long_polls: Any, mode: str, answered: int
):
    """Long polls dropped or held without an answer are retried only until the wait's
    timeout: then WaitTimeout with the job as last seen, or Unavailable when no answer came
    at all; never the retry budget, nor a request's own timeout, past it."""
    api = long_polls(mode, answered)
    expected = WaitTimeout if answered else Unavailable
    with (
        Client(api.url, retries=PATIENT) as client,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        started = time.monotonic()
        waiting = pool.submit(client.wait, api.job["id"], WAIT)
        try:
            with pytest.raises(expected) as raised:
                waiting.result(timeout=WAIT + LATE)  # else TimeoutError: the wait overran
        finally:
            api.released.set()  # held polls end, so that an overrunning wait ends too
        elapsed = time.monotonic() - started
    assert WAIT - 0.01 <= elapsed < WAIT + LATE
    if isinstance(raised.value, WaitTimeout):
        assert raised.value.job.id == api.job["id"] and raised.value.job.status == "pending"
        assert f"is still pending after {WAIT:g}s" in str(raised.value)
    polls_end_in_time(api, started)
