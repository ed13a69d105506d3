"""API_PROCESSES with the real `jobqueue-api` (docs/configuration.md): one port served by
that many processes, whose /metrics sums them all, all stopped gracefully by one SIGTERM;
one that dies takes the others and the supervisor with it; a bad value exits 2 naming the
variable."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from tests.procs import Service, free_port, wait_for

pytestmark = pytest.mark.e2e


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead: its parent has not read its status yet.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_two_processes_serve_one_port_and_stop_together_on_sigterm(start_api):
    api = start_api(API_PROCESSES="2")
    pids = wait_for(
        lambda: len(children(api.service.proc.pid)) == 2 and children(api.service.proc.pid),
        30,
        "two processes",
    )
    # Every process must be ready: its own pool, its own schema check.
    wait_for(lambda: all(api.status_of("/readyz") == 200 for _ in range(10)), 30, "ready")
    before = {pid: cpu_ticks(pid) for pid in pids}
    for _ in range(120):  # a new connection each: the kernel spreads them
        answer = httpx.post(
            api.base + "/jobs", json={"type": "sleep", "payload": {"duration": "0s"}}, timeout=10
        )
        assert answer.status_code == 201
    used = {pid: cpu_ticks(pid) - before[pid] for pid in pids}
    assert all(ticks > 0 for ticks in used.values()), used  # both served requests
    # Whichever process answers /metrics, it counts the service's submits, not its own.
    for _ in range(6):
        page = httpx.get(api.base + "/metrics", timeout=10).text
        assert "jobs_submitted_total 120.0" in page, page

    assert api.service.stop(60) == 0
    assert not any(alive(pid) for pid in pids)
    stopped = [line for line in api.service.logs() if line["msg"] == "stopped"]
    assert len(stopped) == 2
    (summary,) = [line for line in api.service.logs() if line["msg"] == "API processes stopped"]
    assert summary["exit_statuses"] == [0, 0]


def test_a_process_that_dies_stops_the_others_and_the_supervisor(start_api):
    api = start_api(API_PROCESSES="2")
    first, second = wait_for(
        lambda: len(children(api.service.proc.pid)) == 2 and children(api.service.proc.pid),
        30,
        "two processes",
    )
    # Both serving, so both have their signal handlers: a SIGTERM that reached one still
    # starting would end it by the signal (143), not by its graceful shutdown.
    wait_for(
        lambda: sum(e["msg"].startswith("Running on") for e in api.service.logs()) == 2,
        30,
        "both processes serving",
    )
    os.kill(first, signal.SIGKILL)
    assert api.service.wait(60) == 128 + signal.SIGKILL
    assert not alive(second)
    (line,) = [
        e for e in api.service.logs() if e["msg"] == "an API process exited: stopping the others"
    ]
    assert line["pid"] == first and line["exit_status"] == 128 + signal.SIGKILL


def test_the_processes_stop_when_the_supervisor_is_killed(start_api):
    api = start_api(API_PROCESSES="2")
    pids = wait_for(
        lambda: len(children(api.service.proc.pid)) == 2 and children(api.service.proc.pid),
        30,
        "two processes",
    )
    os.kill(api.service.proc.pid, signal.SIGKILL)
    wait_for(lambda: not any(alive(pid) for pid in pids), 30, "the processes to stop")


@pytest.mark.parametrize("value", ["0", "65", "two"])
def test_a_bad_api_processes_exits_2_naming_it(database_url, value):
    service = Service(
        "jobqueue-api",
        {
            "DATABASE_URL": database_url,
            "HTTP_ADDR": f"127.0.0.1:{free_port()}",
            "API_PROCESSES": value,
        },
    )
    assert service.wait(60) == 2
    (line,) = service.logs()
    assert line["variable"] == "API_PROCESSES"
