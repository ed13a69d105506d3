"""`scripts/run.py` (`make run`): migrations, both services, graceful and forced stops."""

from __future__ import annotations

import json
import os
import signal
import socket
import urllib.request
from contextlib import suppress
from pathlib import Path

import pytest

from tests.procs import Service, free_port, wait_for

pytestmark = [pytest.mark.e2e]

RUN = str(Path(__file__).resolve().parents[2] / "scripts" / "run.py")
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def request(method: str, url: str, body: object = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with _opener.open(req, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def start(database_url: str, **env: str) -> tuple[Service, str]:
    api = f"127.0.0.1:{free_port()}"
    settings = {
        "DATABASE_URL": database_url,
        "HTTP_ADDR": api,
        "METRICS_ADDR": f"127.0.0.1:{free_port()}",
        "POLL_INTERVAL": "100ms",
        "API_TOKENS": "",
        **env,
    }
    return Service("python", settings, args=[RUN]), f"http://{api}"


def ready(service: Service) -> bool:
    return any("jobqueue is ready" in entry["msg"] for entry in service.logs())


def pids(service: Service) -> list[int]:
    return [
        entry["pid"]
        for entry in service.logs()
        if entry["logger"] == "jobqueue.run" and entry["msg"].endswith(" started")
    ]


def cleanup(run: Service) -> None:
    run.kill()
    for pid in pids(run):  # in sessions of their own: not in run.py's process group
        with suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_run_migrates_an_empty_database_runs_a_job_and_stops_cleanly_on_ctrl_c(
    empty_database_url,
):
    run, api = start(empty_database_url)
    try:
        wait_for(lambda: ready(run) or run.proc.poll() is not None, 90, "services ready")
        assert run.proc.poll() is None, run.output()
        status, job = request(
            "POST", f"{api}/jobs", {"type": "sleep", "payload": {"duration": "200ms"}}
        )
        assert status == 201, job

        def completed():
            status, body = request("GET", f"{api}/jobs/{job['id']}/status")
            assert status == 200, body
            return body["status"] == "completed"

        wait_for(completed, 60, "the sleep job to complete", interval=0.2)
        services = pids(run)
        assert len(services) == 2
        run.signal(signal.SIGINT)
        assert run.wait(60) == 0, run.output()
        assert not any(alive(pid) for pid in services)
        run.logs()  # every line, the services' included, is JSON
    finally:
        cleanup(run)


def test_a_service_exiting_on_its_own_stops_the_other_and_sets_the_exit_status(database_url):
    # The worker cannot listen on a taken METRICS_ADDR and exits 1; the API starts fine.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        run, _ = start(database_url, METRICS_ADDR=f"127.0.0.1:{taken.getsockname()[1]}")
        try:
            assert run.wait(90) == 1, run.output()
            assert len(pids(run)) == 2 and not any(alive(pid) for pid in pids(run))
            assert any("jobqueue-worker exited with status 1" in e["msg"] for e in run.logs())
        finally:
            cleanup(run)


def test_second_ctrl_c_kills_both_services_at_once(database_url):
    run, api = start(database_url, SHUTDOWN_TIMEOUT="5m", JOB_TIMEOUT="5m", LEASE_DURATION="6m")
    try:
        wait_for(lambda: ready(run) or run.proc.poll() is not None, 90, "services ready")
        status, job = request(
            "POST", f"{api}/jobs", {"type": "sleep", "payload": {"duration": "5m"}}
        )
        assert status == 201, job
        wait_for(
            lambda: request("GET", f"{api}/jobs/{job['id']}/status")[1]["status"] == "processing",
            60,
            "the job to be claimed",
            interval=0.2,
        )
        run.signal(signal.SIGINT)  # the worker now waits up to SHUTDOWN_TIMEOUT for the job
        wait_for(lambda: any("stopping" in e["msg"] for e in run.logs()), 30, "stopping")
        run.signal(signal.SIGINT)
        assert run.wait(30) == 130, run.output()
        wait_for(lambda: not any(alive(pid) for pid in pids(run)), 30, "both services gone")
    finally:
        cleanup(run)


def test_migration_failure_stops_before_starting_services():
    unreachable = f"postgresql://127.0.0.1:{free_port()}/jobqueue"
    run, _ = start(unreachable)
    try:
        assert run.wait(90) == 1, run.output()
        assert pids(run) == []
        assert any(entry.get("step") == "migrations" for entry in run.logs())
    finally:
        cleanup(run)


def test_services_stop_when_run_is_killed_outright(database_url):
    run, _ = start(database_url)
    try:
        services = wait_for(lambda: len(pids(run)) == 2 and pids(run), 90, "both services started")
        wait_for(lambda: all(alive(pid) for pid in services), 30, "both services running")
        run.kill()  # SIGKILL: run.py cannot forward anything
        wait_for(lambda: not any(alive(pid) for pid in services), 60, "both services gone")
    finally:
        cleanup(run)
