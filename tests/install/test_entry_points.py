"""`python -m jobqueue_api`, `python -m jobqueue_worker` and `python -m jobcore.client` run
the services and the command line, as their console scripts do."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import pytest

from tests.procs import Service, free_port, wait_for

pytestmark = pytest.mark.e2e

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _ready(url: str) -> bool:
    try:
        with _opener.open(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.mark.parametrize(
    ("module", "variable"), [("jobqueue_api", "HTTP_ADDR"), ("jobqueue_worker", "METRICS_ADDR")]
)
def test_python_m_runs_the_service_until_sigterm(database_url, module, variable):
    addr = f"127.0.0.1:{free_port()}"
    # The prefixed name, as a deployment sharing its environment would set it.
    env = {"JOBQUEUE_DATABASE_URL": database_url, f"JOBQUEUE_{variable}": addr}
    service = Service("python", env, args=["-m", module])
    try:
        wait_for(
            lambda: _ready(f"http://{addr}/readyz") or service.proc.poll() is not None,
            60,
            f"{module} ready",
        )
        assert service.proc.poll() is None, service.output()
        assert service.stop(60) == 0, service.output()
        service.logs()  # JSON lines, as the console script's
    finally:
        if service.proc.poll() is None:
            service.kill()


def test_python_m_jobcore_client_is_the_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "jobcore.client", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: jobqueue ")
    usage = subprocess.run(
        [sys.executable, "-m", "jobcore.client", "frobnicate"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert usage.returncode == 2
