"""Why a job failed, as the executor records it (over the in-memory store): each failed attempt
adds an entry to the job's `errors` with its traceback, whether the handler ran as a
coroutine or in a thread; a success or a snooze adds none; the failure is logged with the
traceback at warning when the job runs again and at error when it ended the job. A job of a
type the worker has no handler for is given back, never failed."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from jobcore import JobContext, Snooze, handler
from jobcore.states import Status
from tests.worker.fakestore import FakeJob, FakeStore
from tests.worker.stack import Stack
from tests.worker.support import until


def _deep_in_the_handler() -> None:
    raise ValueError("the handler's failure")


@handler("unit.errors.async")
async def fails_async(payload: Any, ctx: JobContext) -> None:
    _deep_in_the_handler()


@handler("unit.errors.thread")
def fails_in_thread(payload: Any, ctx: JobContext) -> None:
    _deep_in_the_handler()


@handler("unit.errors.hangs")
async def hangs(payload: Any, ctx: JobContext) -> None:
    await asyncio.sleep(30)


@handler("unit.errors.ok")
async def succeeds(payload: Any, ctx: JobContext) -> None:
    return None


@handler("unit.errors.snooze")
async def snoozes(payload: Any, ctx: JobContext) -> None:
    raise Snooze(3600)


@handler("unit.errors.unstorable")
async def returns_what_cannot_be_stored(payload: Any, ctx: JobContext) -> object:
    return object()


async def _run_until(store: FakeStore, done: Any, **stack: Any) -> None:
    async with Stack(store, **stack):
        await until(done, 20, "the attempts recorded")


def _tried(job: FakeJob, attempts: int = 1) -> bool:
    return job.status is not Status.PROCESSING and len(job.errors) >= attempts


def _last_frame(traceback: str | None) -> str:
    """The line naming the innermost frame: where the exception was raised."""
    assert traceback is not None
    frames = [line for line in traceback.splitlines() if line.lstrip().startswith("File ")]
    return frames[-1]


@pytest.mark.parametrize("job_type", ["unit.errors.async", "unit.errors.thread"])
async def test_each_failed_attempt_is_recorded_with_its_traceback(job_type: str):
    store = FakeStore()
    job_id = store.add(job_type, max_attempts=2)
    job = store.jobs[job_id]
    await _run_until(store, lambda: job.status is Status.DEAD_LETTER, backoff_base=0.01)
    assert [(e["attempt"], e["error"]) for e in job.errors] == [
        (1, "ValueError: the handler's failure"),
        (2, "ValueError: the handler's failure"),
    ]
    for entry in job.errors:
        assert "in _deep_in_the_handler" in _last_frame(entry["traceback"])
        assert entry["traceback"].rstrip().endswith("ValueError: the handler's failure")


async def test_a_timeout_of_an_async_handler_shows_where_it_was_stopped():
    store = FakeStore()
    job = store.jobs[store.add("unit.errors.hangs", max_attempts=1)]
    await _run_until(store, lambda: _tried(job), job_timeout=0.2)
    assert job.status is Status.DEAD_LETTER
    (entry,) = job.errors
    assert entry["error"] == "JobTimeout: timed out after 0.2s"
    # The cancellation that stopped it, through the handler's frame: where it hung.
    frames = [line.strip() for line in entry["traceback"].splitlines() if "File " in line]
    assert any(frame.endswith("in hangs") for frame in frames)
    assert entry["traceback"].rstrip().splitlines()[-1].endswith("CancelledError")


async def test_a_result_that_cannot_be_stored_is_a_failed_attempt():
    store = FakeStore()
    job = store.jobs[store.add("unit.errors.unstorable")]
    await _run_until(store, lambda: _tried(job))
    assert job.status is Status.FAILED
    (entry,) = job.errors
    assert entry["error"] == job.last_error and entry["traceback"] is not None


async def test_a_success_or_a_snooze_adds_no_entry():
    store = FakeStore()
    done = store.jobs[store.add("unit.errors.ok")]
    snoozed = store.jobs[store.add("unit.errors.snooze")]
    await _run_until(
        store, lambda: done.status is Status.COMPLETED and snoozed.status is Status.PENDING
    )
    assert done.errors == [] and snoozed.errors == []


async def test_a_failure_is_logged_with_its_traceback_at_warning_then_at_error(caplog):
    caplog.set_level(logging.INFO, logger="jobqueue.worker")
    store = FakeStore()
    job = store.jobs[store.add("unit.errors.async", max_attempts=2)]
    await _run_until(store, lambda: job.status is Status.DEAD_LETTER, backoff_base=0.01)
    finished = [r for r in caplog.records if r.getMessage() == "job finished"]
    assert [(r.levelno, r.__dict__["outcome"]) for r in finished] == [
        (logging.WARNING, "retried"),
        (logging.ERROR, "dead_letter"),
    ]
    assert [r.__dict__["exc"] for r in finished] == [e["traceback"] for e in job.errors]


def _unhandled_count(job_type: str) -> float:
    return REGISTRY.get_sample_value("jobs_unhandled_total", {"type": job_type}) or 0.0


async def test_a_job_of_a_type_without_a_handler_is_given_back_never_failed(caplog):
    caplog.set_level(logging.INFO, logger="jobqueue.worker")
    store = FakeStore()
    job_type = f"unit.errors.nobody-{time.monotonic_ns()}"
    first = store.jobs[store.add(job_type, max_attempts=1)]
    second = store.jobs[store.add(job_type, max_attempts=1)]
    counted = _unhandled_count(job_type)
    await _run_until(store, lambda: _tried(first) and _tried(second))
    for job in (first, second):
        assert job.status is Status.PENDING and job.attempts == 0  # its last attempt kept
        assert job.delay == 1.0  # the first give-back: due again in a second
        assert job.errors == [
            {
                "attempt": 1,
                "at": job.errors[0]["at"],
                "error": f"no handler for type {job_type!r} in this worker",
                "traceback": None,
            }
        ]
    assert _unhandled_count(job_type) == counted + 2
    warned = [
        r for r in caplog.records if r.levelno == logging.WARNING and "no handler" in r.getMessage()
    ]
    assert len(warned) == 1  # once per type per minute, not once per job
