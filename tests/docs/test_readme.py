"""The README's "Your first handler" runs as written: its handler module under a real
`jobqueue-api` and `jobqueue-worker` (started with the variables of its `make run` line),
its `jobqueue submit` line, its client snippet, its test snippet and its transactional
enqueue, each checked against what its comments say it prints."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.e2e.test_api_process import Api
from tests.procs import BIN, wait_for
from tests.worker.support import ROOT, Worker, start_worker

pytestmark = pytest.mark.e2e

SECTION = ("## Your first handler\n", "## Layout\n")
# Where the README says "your project"; the test puts it in a temporary folder.
PROJECT_PLACEHOLDER = "/path/to/your/project"
# The database of `make run` in the README; the test's own database in its place.
README_DATABASE = "postgresql+psycopg://localhost:5432/jobqueue"


def blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block of the section, in order."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(SECTION[0]) : text.index(SECTION[1])]
    return re.findall(r"```(\w+)\n(.*?)```", section, re.DOTALL)


def python_block(first_line: str) -> str:
    (code,) = [code for lang, code in blocks() if lang == "python" and code.startswith(first_line)]
    return code


def shell_lines() -> list[str]:
    (code,) = [code for lang, code in blocks() if lang == "sh"]
    return code.strip().splitlines()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The README's handler module, written where it says."""
    project = tmp_path / "project"
    module = python_block("# myapp/jobs.py")
    (project / "myapp").mkdir(parents=True)
    (project / "myapp" / "__init__.py").write_text("")
    (project / "myapp" / "jobs.py").write_text(module)
    return project


def env_of_make_run(project: Path) -> dict[str, str]:
    """The variables the README's `make run` line sets, the project's path filled in."""
    (line,) = [line for line in shell_lines() if "make run" in line]
    words = shlex.split(line.replace(PROJECT_PLACEHOLDER, str(project)))
    assert words[-2:] == ["make", "run"]
    env = dict(word.split("=", 1) for word in words[:-2])
    assert env["JOB_HANDLERS"] == "myapp.jobs"
    # The services of this test also need this tree's own code first on the path.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env["PYTHONPATH"], *sys.path]))
    return env


@pytest.fixture
def services(
    database_url: str, start_api: Callable[..., Api], project: Path, tmp_path: Path
) -> Iterator[tuple[Api, Worker]]:
    env = env_of_make_run(project)
    worker = start_worker(database_url, tmp_path, **env)
    try:
        yield start_api(**env), worker
    finally:
        worker.stop()


def client_env(api: Api, project: Path) -> dict[str, str]:
    path = os.pathsep.join([str(project), *sys.path])
    return {**os.environ, "JOBQUEUE_URL": api.base, "PYTHONPATH": path}


def test_the_first_handler_runs_under_the_real_services(services, project, database_url):
    api, _ = services
    env = client_env(api, project)

    # The command line: `.venv/bin/jobqueue submit ... --wait --json`, exit 0, the result.
    (line,) = [line for line in shell_lines() if "jobqueue submit" in line]
    command, _, comment = line.partition("#")
    words = shlex.split(command)
    assert words[0] == ".venv/bin/jobqueue"
    done = subprocess.run(
        [str(BIN / "jobqueue"), *words[1:]], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "exit 0" in comment, done.stdout + done.stderr
    record = json.loads(done.stdout)
    assert record["status"] == "completed" and '"status": "completed"' in comment
    assert json.dumps({"result": record["result"]})[1:-1] in comment

    # The client snippet prints the result its comment shows.
    snippet = python_block("from jobcore.client import Client")
    done = subprocess.run(
        [sys.executable, "-c", snippet], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == snippet.rsplit("# ", 1)[1].strip()

    # Transactional enqueue, on this test's database: the row and the job commit together,
    # and the worker runs the job.
    snippet = python_block("import sqlalchemy as sa")
    assert README_DATABASE in snippet
    url = database_url.replace("postgresql://", "postgresql+psycopg://")
    done = subprocess.run(
        [sys.executable, "-c", snippet.replace(README_DATABASE, url)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()

    def finished() -> dict | None:
        job = api.get(f"/jobs/{job_id}").json()
        return job if job["status"] == "completed" else None

    job = wait_for(finished, 30, "the enqueued job to complete", interval=0.1)
    assert job["result"] == {"greeting": "Hello, Ada!"}
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT name FROM signups").fetchall() == [("Ada",)]

    # "fails at once": a payload without a name ends failed after its first attempt.
    response = api.post("/jobs", json={"type": "greet", "payload": {}})
    assert response.status_code == 201, response.text

    def failed() -> dict | None:
        job = api.get(f"/jobs/{response.json()['id']}").json()
        return job if job["status"] == "failed" else None

    job = wait_for(failed, 30, "the nameless job to fail", interval=0.1)
    assert job["attempts"] == 1 and "greet needs a name" in job["last_error"]


def test_the_handler_test_passes(project):
    # The README's test snippet needs jobcore.testing; skipped where this tree lacks it (an
    # import could otherwise find another checkout's through an editable install).
    if not (ROOT / "shared" / "jobcore" / "testing.py").exists():
        pytest.skip("jobcore.testing is not in this tree")
    pytest.importorskip("jobcore.testing")
    tests = project / "tests"
    tests.mkdir()
    (tests / "test_jobs.py").write_text(python_block("# tests/test_jobs.py"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(project), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_jobs.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
