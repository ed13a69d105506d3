"""The Makefile's installs: `make run` installs only the `server` extra and never replaces a
current dev install; `make install` (what `make test`, `make lint` and CI use) installs the
`dev` extra whenever it is not current, whatever `make run` did before.

Runs the real Makefile in a scratch copy whose `.venv/bin/python` and `.venv/bin/uv` are
stand-ins that only record how they were called."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.worker.support import ROOT

FAKE = """#!/bin/sh
echo "$(basename "$0") $*" >> "$(dirname "$0")/calls.log"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    bin = tmp_path / ".venv" / "bin"
    bin.mkdir(parents=True)
    for name in ("python", "uv"):
        (bin / name).write_text(FAKE)
        (bin / name).chmod(0o755)
    return tmp_path


def make(project: Path, target: str) -> list[str]:
    """Run `make target`; the stand-ins' calls it made."""
    log = project / ".venv" / "bin" / "calls.log"
    log.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    done = subprocess.run(
        ["make", "-s", target], cwd=project, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return log.read_text().splitlines() if log.exists() else []


def installs(calls: list[str]) -> list[str]:
    return [call.split()[-1] for call in calls if call.startswith("uv pip install")]


def touch_later(path: Path) -> None:
    """Make `path` newer than every stamp (file times may have a coarse resolution)."""
    later = time.time() + 5
    os.utime(path, (later, later))


def test_make_run_installs_only_the_server_extra_then_make_test_installs_dev(project):
    calls = make(project, "run")
    assert installs(calls) == [".[server]"]
    assert calls[-1] == "python scripts/run.py"
    assert installs(make(project, "run")) == []  # current: nothing to do
    assert installs(make(project, "install")) == [".[dev]"]


def test_make_run_after_make_test_keeps_the_dev_install(project):
    assert installs(make(project, "install")) == [".[dev]"]
    calls = make(project, "run")
    assert installs(calls) == [] and calls == ["python scripts/run.py"]
    assert installs(make(project, "install")) == []


def test_a_changed_pyproject_reinstalls_each_on_its_next_run(project):
    make(project, "install")
    make(project, "run")
    touch_later(project / "pyproject.toml")
    # The dev install is stale now: make run adds the server extra to it (uv pip install
    # removes nothing), and make install brings the dev extra up to date again.
    assert installs(make(project, "run")) == [".[server]"]
    assert installs(make(project, "install")) == [".[dev]"]
