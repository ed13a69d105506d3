"""The per-job log lines' fast path (jobcore.logs.line / batch): the very line the logger
would write, whole JSON objects only, and a few writes per batch instead of one per line."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from uuid import uuid4

import pytest

from jobcore import logs

log = logging.getLogger("jobqueue.worker")


class Stdout(io.StringIO):
    """Stands in for stdout, remembering each write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []
        self.handler: logging.Handler | None = None

    def alone(self) -> None:
        """Leave configure()'s handler the only one, as in a worker process (pytest adds its
        own during each test)."""
        assert self.handler is not None
        logging.getLogger().handlers[:] = [self.handler]

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)

    def lines(self) -> list[str]:
        return self.getvalue().splitlines()


@pytest.fixture
def stdout(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stdout]:
    """logs.configure() writing to a Stdout, as the worker's does to its stdout."""
    out = Stdout()
    monkeypatch.setattr(sys, "stdout", out)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    logs.configure("info")
    out.handler = root.handlers[0]
    try:
        yield out
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@contextmanager
def no_log_records() -> Iterator[None]:
    """Fail if a LogRecord is made: the fast path must do without."""

    def refuse(*args: object, **kwargs: object) -> logging.LogRecord:
        raise AssertionError("a LogRecord was made")

    saved = logging.Logger.makeRecord
    logging.Logger.makeRecord = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        logging.Logger.makeRecord = saved  # type: ignore[method-assign]


def _job_fields() -> logs.Fields:
    return logs.Fields(job_id=str(uuid4()), job_type="résumé", attempt=2, lease_token=9)


FINISHED = {
    "outcome": "retried",
    "duration_ms": 12.5,
    "error": 'ValueError: "quoted"\nnew line',
    "retry_in": 1.25,
}


def test_a_job_line_is_the_line_the_logger_would_write(stdout):
    stdout.alone()
    fields = _job_fields()
    with logs.bind(worker_process=3):
        with no_log_records():
            logs.line(log, "job finished", fields, FINISHED)
        log.info("job finished", extra={**fields.values, **FINISHED})
    fast, slow = stdout.lines()
    # Equal but for the time, which may differ in its milliseconds.
    assert fast.split('"level"', 1)[1] == slow.split('"level"', 1)[1]
    entry = json.loads(fast)
    assert list(entry) == [
        "time",
        "level",
        "logger",
        "msg",
        "worker_process",
        "job_id",
        "job_type",
        "attempt",
        "lease_token",
        *FINISHED,
    ]
    assert entry["job_type"] == "résumé" and entry["error"] == FINISHED["error"]


def test_a_job_line_goes_through_the_logger_when_another_handler_listens(stdout, caplog):
    fields = _job_fields()
    assert len(logging.getLogger().handlers) > 1  # pytest's capture, besides ours
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        logs.line(log, "job started", fields)
    (record,) = [r for r in caplog.records if r.getMessage() == "job started"]
    assert record.job_id == fields.values["job_id"]  # type: ignore[attr-defined]
    assert json.loads(stdout.lines()[-1])["job_id"] == fields.values["job_id"]


def test_a_job_line_is_not_written_below_the_configured_level(stdout):
    stdout.alone()
    logging.getLogger().setLevel(logging.WARNING)
    logs.line(log, "job started", _job_fields())
    assert stdout.lines() == []


def test_a_batch_writes_whole_lines_together_in_pipe_sized_writes(stdout):
    stdout.alone()
    fields = _job_fields()
    with logs.batch():
        with no_log_records():
            for _ in range(100):
                logs.line(log, "job finished", fields, FINISHED)
        log.warning("lease lost", extra={"job_id": "x"})  # any line, not only job lines
        with logs.batch():  # nested: written with the outer batch
            logs.line(log, "job started", fields)
        assert stdout.writes == []
    lines = stdout.lines()
    assert len(lines) == 102 and all(json.loads(line) for line in lines)
    # Far fewer writes than lines, none above PIPE_BUF (so never interleaved with another
    # process's), each ending at the end of a line.
    assert len(stdout.writes) < 10
    assert all(len(w.encode()) <= 4096 and w.endswith("\n") for w in stdout.writes)


def test_a_line_longer_than_a_pipe_write_is_written_alone_and_whole(stdout):
    stdout.alone()
    fields = _job_fields()
    with logs.batch():
        logs.line(log, "job finished", fields, {**FINISHED, "error": "x" * 5000})
        logs.line(log, "job started", fields)
    assert len(stdout.writes) == 2
    assert [len(json.loads(line)["error"]) for line in stdout.lines()[:1]] == [5000]


def test_lines_of_other_threads_are_not_held_by_a_batch(stdout):
    stdout.alone()
    fields = _job_fields()
    with logs.batch():
        logs.line(log, "job started", fields)
        thread = threading.Thread(target=lambda: log.info("from a handler thread"))
        thread.start()
        thread.join()
        assert [json.loads(line)["msg"] for line in stdout.lines()] == ["from a handler thread"]
    assert len(stdout.lines()) == 2
