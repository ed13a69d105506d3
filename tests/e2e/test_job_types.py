"""Types without code, with the real services: an API started without any handler module
accepts a type once a worker recorded it (with that handler's options as defaults), runs
it there with the result's conversions, and refuses a type nobody declared; a worker whose
handler module holds a handler that cannot take (payload, ctx) exits 2 naming it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.e2e.test_api_process import Api
from tests.procs import wait_for
from tests.worker.support import start_worker

pytestmark = pytest.mark.e2e


def test_an_api_without_handler_code_accepts_what_a_worker_recorded(
    database_url, tmp_path, start_api: Callable[..., Api]
):
    api = start_api(JOB_HANDLERS="", JOB_TYPES="test.e2e.named")
    refused = api.post("/jobs", json={"type": "test.options.receipt"})
    assert refused.status_code == 400 and "JOB_TYPES" in refused.json()["error"]
    assert api.post("/jobs", json={"type": "test.e2e.named"}).status_code == 201

    worker = start_worker(
        database_url, tmp_path, JOB_HANDLERS="tests.worker.handlers_options", QUEUES="mail"
    )
    try:

        def accepted():
            answer = api.post("/jobs", json={"type": "test.options.receipt"})
            return answer.json() if answer.status_code == 201 else None

        job = wait_for(accepted, 60, "the API to accept the recorded type")
        assert (job["queue"], job["priority"], job["max_attempts"], job["timeout"]) == (
            "mail",
            5,
            3,
            60.0,
        )

        def finished():
            found = api.get(f"/jobs/{job['id']}").json()
            return found if found["status"] == "completed" else None

        done = wait_for(finished, 60, "the worker to run the job")
        assert done["result"] == {
            "at": "2026-03-01T12:30:00+00:00",
            "amount": "9.99",
            "id": "00000000-0000-0000-0000-000000000001",
            "pair": [1, 2],
        }
        assert api.post("/jobs", json={"type": "test.e2e.nobody"}).status_code == 400
    finally:
        worker.stop(30)


def test_a_worker_importing_a_handler_with_a_bad_signature_exits_2_naming_it(
    database_url, tmp_path
):
    worker = start_worker(
        database_url, tmp_path, JOB_HANDLERS="tests.worker.handlers_bad_signature"
    )
    assert worker.wait(60) == 2
    (line,) = worker.logs()
    assert line["level"] == "error" and line["variable"] == "JOB_HANDLERS"
    assert "'test.bad.signature'" in line["msg"] and "takes_only_the_payload" in line["msg"]
    assert "fn(payload, ctx)" in line["msg"]
