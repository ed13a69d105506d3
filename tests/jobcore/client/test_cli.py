"""The `jobqueue` console script, run as a process against the real API and worker: its
output for people and for scripts (`--json`), its exit statuses, and `--help`."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import termios
import threading
import time
from typing import Any

import pytest

from tests.jobcore.client.conftest import TOKEN, Stack, record
from tests.procs import BIN, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("jobcore_client")]


class Run:
    def __init__(self, done: subprocess.CompletedProcess[str]) -> None:
        self.code = done.returncode
        self.out = done.stdout
        self.err = done.stderr

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def jobqueue(stack: Stack) -> Any:
    def run(*args: str, stdin: str | None = None, **env: str) -> Run:
        full = {
            **os.environ,
            "JOBQUEUE_URL": stack.url,
            "JOBQUEUE_TOKEN": TOKEN,
            **env,
        }
        done = subprocess.run(
            [str(BIN / "jobqueue"), *args],
            env=full,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "Traceback" not in done.stderr, done.stderr
        return Run(done)

    return run


def test_help_is_there_for_every_command(jobqueue: Any):
    assert jobqueue("--help").code == 0
    for command in (
        "submit",
        "get",
        "wait",
        "list",
        "retry",
        "cancel",
        "queues",
        "pause",
        "resume",
    ):
        shown = jobqueue(command, "--help")
        assert shown.code == 0 and f"usage: jobqueue {command}" in shown.out


def test_submit_and_get_print_a_table_for_people_and_json_for_scripts(jobqueue: Any, queue: str):
    made = jobqueue(
        "submit", "sleep", '{"duration": "1s"}', "--queue", queue, "--priority", "3", "--json"
    )
    assert made.code == 0, made.err
    job = made.json()
    assert (job["type"], job["status"], job["queue"], job["priority"]) == (
        "sleep",
        "pending",
        queue,
        3,
    )
    # --json before the command works as well as after it.
    # The full record: the failed attempts too, none yet.
    assert jobqueue("--json", "get", job["id"]).json() == {**job, "errors": []}
    table = jobqueue("get", job["id"])
    assert table.code == 0
    for text in (job["id"], "pending", queue, '{"duration": "1s"}', "0 of 5"):
        assert text in table.out


def test_submit_takes_every_field_and_the_payload_from_stdin(jobqueue: Any, queue: str):
    made = jobqueue(
        "submit",
        "sleep",
        "-",
        "--queue",
        queue,
        "--delay",
        "1h",
        "--timeout",
        "90s",
        "--max-attempts",
        "2",
        "--concurrency-key",
        "tenant-7",
        "--idempotency-key",
        f"{queue}-1",
        "--json",
        stdin='{"duration": "2s"}',
    )
    job = made.json()
    assert job["payload"] == {"duration": "2s"}
    assert (job["timeout"], job["max_attempts"], job["concurrency_key"]) == (90.0, 2, "tenant-7")
    assert re.search(r"concurrency_key +tenant-7", jobqueue("get", job["id"]).out)
    again = jobqueue(
        "submit", "sleep", '{"duration":"2s"}', "--queue", queue, "--timeout", "1m30s",
        "--max-attempts", "2", "--concurrency-key", "tenant-7", "--idempotency-key",
        f"{queue}-1", "--json",
    )  # fmt: skip
    assert again.json()["id"] == job["id"]
    later = jobqueue(
        "submit", "sleep", "--queue", queue, "--run-at", "2100-01-01T00:00:00Z", "--json"
    )
    assert later.json()["run_at"] == "2100-01-01T00:00:00.000000Z"


def test_wait_exits_0_when_the_job_completed_and_1_when_it_did_not(jobqueue: Any, queue: str):
    done = jobqueue("submit", "sleep", '{"duration": "0.2s"}', "--wait", "--json")
    assert done.code == 0, done.err
    assert done.json()["status"] == "completed"
    failed = jobqueue("submit", "test.permanent", "--wait")
    assert failed.code == 1 and "failed" in failed.out and "can never succeed" in failed.out
    idle = jobqueue("submit", "sleep", "--queue", queue, "--json").json()
    timed_out = jobqueue("wait", idle["id"], "--timeout", "0.3s", "--json")
    assert timed_out.code == 1
    assert timed_out.json()["status"] == "pending"  # the record as it stood
    assert f"job {idle['id']} is still pending after 0.3s" in timed_out.err


def test_list_pages_through_the_filters_and_says_when_more_match(jobqueue: Any, queue: str):
    ids = [jobqueue("submit", "sleep", "--queue", queue, "--json").json()["id"] for _ in range(3)]
    listed = jobqueue("list", "--queue", queue, "--limit", "2", "--json")
    assert [job["id"] for job in listed.json()] == ids[:0:-1]
    table = jobqueue("list", "--queue", queue, "--limit", "2")
    assert ids[2] in table.out and ids[0] not in table.out
    assert "2 jobs, newest first; more match" in table.out
    none = jobqueue("list", "--queue", queue, "--status", "failed,dead_letter")
    assert none.code == 0 and "no jobs match" in none.out
    assert jobqueue("list", "--status", "nope").code == 2


def test_cancel_retry_and_their_conflicts(jobqueue: Any, queue: str):
    job = jobqueue("submit", "sleep", "--queue", queue, "--json").json()
    cancelled = jobqueue("cancel", job["id"])
    assert cancelled.code == 0 and "cancelled" in cancelled.out
    again = jobqueue("cancel", job["id"])
    assert again.code == 1
    assert again.err.strip().endswith("can be cancelled (HTTP 409)")
    assert len(again.err.strip().splitlines()) == 1
    assert jobqueue("retry", job["id"], "--json").json()["status"] == "pending"
    assert jobqueue("retry", job["id"]).code == 1
    missing = jobqueue("get", "01a22aae-32d0-7c31-b68d-fb41a7ea06d6")
    assert missing.code == 1 and "not found (HTTP 404)" in missing.err and missing.out == ""


def test_cancel_and_retry_by_filter_print_the_counts(jobqueue: Any, queue: str):
    for _ in range(3):
        jobqueue("submit", "sleep", "--queue", queue)
    done = jobqueue("cancel", "--queue", queue, "--limit", "2")
    assert done.code == 0, done.err
    assert done.out.strip() == "cancelled 2, cancel requested 0; more match: run it again"
    rest = jobqueue("cancel", "--queue", queue, "--status", "pending", "--json").json()
    assert rest == {"cancelled": 1, "cancel_requested": 0, "more": False}
    retried = jobqueue("retry", "--queue", queue, "--status", "cancelled")
    assert (retried.code, retried.out.strip()) == (0, "retried 3")
    # Neither a job nor a filter, or both: usage errors; a filter the API refuses too.
    assert jobqueue("cancel").code == 2
    assert jobqueue("retry", "01a22aae-32d0-7c31-b68d-fb41a7ea06d6", "--queue", queue).code == 2
    assert jobqueue("cancel", "--status", "bogus").code == 2
    assert jobqueue("cancel", "--queue", queue, "--limit", "10001").code == 2


def test_pause_and_resume_a_queue(jobqueue: Any, queue: str):
    paused = jobqueue("pause", queue)
    assert (paused.code, paused.out.strip()) == (0, f"{queue}: paused")
    depths = {depth["queue"]: depth for depth in jobqueue("queues", "--json").json()}
    assert depths[queue]["paused"] is True
    assert jobqueue("resume", queue, "--json").json() == {"queue": queue, "paused": False}
    assert jobqueue("pause", "Not A Queue").code == 2


def test_queues_shows_each_queue(jobqueue: Any, queue: str):
    jobqueue("submit", "sleep", "--queue", queue)
    depths = {depth["queue"]: depth for depth in jobqueue("queues", "--json").json()}
    assert depths[queue]["pending"] == 1
    assert queue in jobqueue("queues").out


def test_usage_errors_exit_2(jobqueue: Any, queue: str):
    assert jobqueue("submit", "sleep", "{not json").code == 2
    assert jobqueue("submit", "sleep", "--delay", "soon").code == 2
    assert (
        jobqueue("submit", "sleep", "--delay", "1s", "--run-at", "2100-01-01T00:00:00Z").code == 2
    )
    assert jobqueue("submit", "sleep", "--wait-timeout", "1s").code == 2
    assert jobqueue("frobnicate").code == 2
    assert jobqueue().code == 2
    refused = jobqueue("submit", "sleep", "--queue", queue, "--priority", "1000")
    assert refused.code == 2 and "field 'priority' must be an integer" in refused.err
    assert jobqueue("queues", JOBQUEUE_URL="localhost:8080").code == 2


def test_an_unreachable_api_or_a_wrong_token_exits_1_with_one_line(jobqueue: Any):
    down = jobqueue("queues", JOBQUEUE_URL=f"http://127.0.0.1:{free_port()}")
    assert down.code == 1 and "cannot reach" in down.err
    assert len(down.err.strip().splitlines()) == 1
    refused = jobqueue("queues", "--token", "wrong")
    assert refused.code == 1 and "missing or invalid bearer token (HTTP 401)" in refused.err


def test_wait_shows_its_progress_on_a_terminal_only(jobqueue: Any, stack: Stack):
    job = jobqueue("submit", "sleep", '{"duration": "0.2s"}', "--json").json()
    quiet = jobqueue("wait", job["id"])
    assert quiet.code == 0 and "completed" in quiet.out and quiet.err == ""

    job = jobqueue("submit", "sleep", '{"duration": "8s"}', "--json").json()
    # Processing before the command starts (its start takes seconds on a loaded machine):
    # its first look shows it so.
    deadline = time.monotonic() + 30
    while jobqueue("get", job["id"], "--json").json()["status"] != "processing":
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    main, terminal = pty.openpty()
    shown = bytearray()

    def read() -> None:  # drained while it runs, so the status line never blocks the process
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal closed with the process
                return
            if not chunk:
                return
            shown.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    env = {**os.environ, "JOBQUEUE_URL": stack.url, "JOBQUEUE_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [str(BIN / "jobqueue"), "wait", job["id"]],
        env=env,
        stdout=subprocess.PIPE,
        stderr=terminal,
        text=True,
    )
    os.close(terminal)
    out, _ = proc.communicate(timeout=60)
    reader.join(10)
    os.close(main)
    assert proc.returncode == 0 and "completed" in out
    assert b"processing, attempt 1 of 5" in shown


LONG_TYPE = "reports.monthly_revenue_reconciliation_for_every_region"
LONG_QUEUE = "tenant-acme-corporation-eu-west-1-nightly-batch"


def _terminal(columns: int) -> tuple[int, int]:
    """A pseudo-terminal (its main side, its terminal side) `columns` wide."""
    main, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    return main, terminal


def _env(url: str) -> dict[str, str]:
    env = {**os.environ, "JOBQUEUE_URL": url, "TERM": "xterm"}
    for name in ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE"):
        env.pop(name, None)
    return env


def _long_jobs(scripted: Any) -> tuple[str, list[dict[str, Any]]]:
    """An API whose `GET /jobs` answers three jobs of a long type in a long queue."""
    jobs = [
        record(type=LONG_TYPE, queue=LONG_QUEUE, attempts=3, max_attempts=25, priority=-100)
        for _ in range(3)
    ]
    page = json.dumps({"jobs": jobs, "next_cursor": None}).encode()
    return scripted((200, {}, page)).url, jobs


def test_list_and_get_through_a_pipe_are_printed_whole_at_any_width(scripted: Any):
    """Not a terminal on stdout: every column at full width, never cut to 80 columns (no
    terminal anywhere) nor to the width of a terminal that stdin is (`jobqueue list | ...`
    typed at a narrow one)."""
    url, jobs = _long_jobs(scripted)
    payload = {"report": "x" * 150, "regions": ["eu-west-1", "us-east-1", "ap-south-1"]}
    job = record(type=LONG_TYPE, queue=LONG_QUEUE, payload=payload)
    one = scripted((200, {}, json.dumps(job).encode())).url
    main, terminal = _terminal(60)
    try:
        for stdin in (subprocess.DEVNULL, terminal):
            listed = subprocess.run(
                [str(BIN / "jobqueue"), "list"],
                env=_env(url),
                stdin=stdin,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert listed.returncode == 0, listed.stderr
            assert "…" not in listed.stdout, listed.stdout
            for each in jobs:
                (line,) = [line for line in listed.stdout.splitlines() if each["id"] in line]
                assert re.search(
                    rf"{LONG_TYPE} +pending +3/25 +{LONG_QUEUE} +-100 +12-01 04:13:22", line
                ), line
            assert "3 jobs, newest first" in listed.stdout

            shown = subprocess.run(
                [str(BIN / "jobqueue"), "get", job["id"]],
                env=_env(one),
                stdin=stdin,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert shown.returncode == 0, shown.stderr
            lines = shown.stdout.splitlines()
            assert f"payload      {json.dumps(payload)}" in [line.rstrip() for line in lines]
            assert f"type         {LONG_TYPE}" in [line.rstrip() for line in lines]
    finally:
        os.close(main)
        os.close(terminal)


def test_list_on_a_terminal_still_fits_its_width(scripted: Any):
    url, jobs = _long_jobs(scripted)
    main, terminal = _terminal(100)
    shown = bytearray()

    def read() -> None:  # drained while it runs, so that its output never blocks it
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal closed with the process
                return
            if not chunk:
                return
            shown.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    proc = subprocess.Popen(
        [str(BIN / "jobqueue"), "list"],
        env=_env(url),
        stdin=terminal,
        stdout=terminal,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(terminal)
    _, err = proc.communicate(timeout=60)
    reader.join(10)
    os.close(main)
    assert proc.returncode == 0, err
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.decode())  # colours
    lines = [line for line in text.replace("\r\n", "\n").split("\n") if line.strip()]
    assert len(lines) == 2 + len(jobs) + 1, lines  # header, rule, jobs, summary
    assert max(len(line) for line in lines) <= 100, lines
    assert all(each["id"] in text for each in jobs)
    assert "…" in text  # the long type and queue were cut to fit
