"""deploy/Dockerfile, its ignore file, and the pinned requirements it installs."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from tests.deploy.script import validate_deploy

ROOT = validate_deploy.ROOT
INSTRUCTIONS = validate_deploy.dockerfile_instructions()


def runtime_stage() -> list[tuple[str, str]]:
    last_from = max(i for i, (keyword, _) in enumerate(INSTRUCTIONS) if keyword == "FROM")
    return INSTRUCTIONS[last_from:]


def values(keyword: str, stage: list[tuple[str, str]] = INSTRUCTIONS) -> list[str]:
    return [rest for k, rest in stage if k == keyword]


def test_hadolint_finds_nothing() -> None:
    assert validate_deploy.hadolint_findings() == []


def test_build_is_multi_stage_on_a_slim_python_base() -> None:
    stages = values("FROM")
    assert len(stages) >= 2
    (base,) = values("ARG")
    assert base.startswith("PYTHON_IMAGE=python:3.11-slim")
    assert any(v.startswith("--from=build ") for v in values("COPY", runtime_stage()))


def test_dependencies_come_from_the_hashed_lock() -> None:
    runs = " ".join(values("RUN"))
    assert "--require-hashes" in runs
    assert "-r requirements.lock" in runs
    assert any(v.startswith("deploy/requirements.lock ") for v in values("COPY"))


def test_runtime_runs_as_a_numeric_non_root_user() -> None:
    (user,) = values("USER", runtime_stage())
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so Kubernetes can verify runAsNonRoot


def test_signals_reach_the_service() -> None:
    (stopsignal,) = values("STOPSIGNAL", runtime_stage())
    assert stopsignal == "SIGTERM"
    # Exec form: no shell between the init and the service to swallow SIGTERM.
    (entrypoint,) = values("ENTRYPOINT", runtime_stage())
    (cmd,) = values("CMD", runtime_stage())
    assert json.loads(entrypoint) == ["/usr/bin/tini", "--"]
    assert json.loads(cmd) == ["jobqueue-api"]


def test_image_holds_what_the_migration_command_needs() -> None:
    (workdir,) = values("WORKDIR", runtime_stage())
    copies = values("COPY", runtime_stage())
    assert workdir == "/app"
    assert "alembic.ini ./" in copies
    assert "migrations ./migrations" in copies


def test_image_commands_are_the_projects_console_scripts() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {"jobqueue-api", "jobqueue-worker"} <= set(project["scripts"])
    # The image installs the server extra (the services and alembic) from the lock.
    assert "server" in validate_deploy.IMAGE_EXTRAS
    assert any(dep.startswith("alembic") for dep in project["optional-dependencies"]["server"])


def test_prometheus_folder_is_created_for_the_service_user() -> None:
    runs = " ".join(values("RUN", runtime_stage()))
    assert "mkdir -p /var/lib/jobqueue/prometheus" in runs
    assert "chown -R 10001:10001 /var/lib/jobqueue" in runs


def test_build_context_keeps_every_copied_path() -> None:
    ignore = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().splitlines()
    kept = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore, "the context is the repository root: exclude by default"
    for copy in values("COPY"):
        if copy.startswith("--from="):
            continue
        *sources, _ = copy.split()
        for source in sources:
            assert source.rstrip("/") in kept, f"{source} is copied but not in the build context"


def test_lock_pins_every_runtime_dependency() -> None:
    assert validate_deploy.lock_problems() == []


def test_a_stale_lock_is_reported(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\ndependencies = ["alembic>=99", "rich>=13", "sqlalchemy[asyncio]>=2"]\n'
    )
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        "alembic==1.13.0 \\\n    --hash=sha256:00\n    # via jobqueue (pyproject.toml)\n"
        "sqlalchemy==2.0.30\n    # via jobqueue (pyproject.toml)\n"
        "httpx==0.27.0\n    # via jobqueue (pyproject.toml)\n"
    )
    problems = "\n".join(validate_deploy.lock_problems(pyproject, lock))
    assert "alembic==1.13.0 does not satisfy alembic>=99" in problems
    assert "rich>=13 is not pinned" in problems
    assert "greenlet (extra of sqlalchemy[asyncio]>=2) is not pinned" in problems
    assert "httpx is locked as a direct dependency but not in pyproject" in problems
