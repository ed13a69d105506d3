"""`pip install jobqueue` (no extras) gives the client, the `jobqueue` command line and
transactional enqueue without the services' dependencies; the services then say in one
line which extra they need. The wheel is built from this tree and installed into a fresh
virtualenv with uv (as `make install` sets it up), so the test holds for the real package."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import sqlalchemy as sa

from jobcore.schema import jobs
from tests.packaging import UV, installed_venv, wheel

pytestmark = pytest.mark.xdist_group("install-weight")

# What only the services (the `server` extra) or a driver extra bring.
SERVER_ONLY = {
    "starlette",
    "hypercorn",
    "asyncpg",
    "alembic",
    "prometheus-client",
    "pydantic",
    "jinja2",
    "python-multipart",
    "psycopg",
    "psycopg-binary",
    "greenlet",
}
# The base install's packages (jobqueue itself included) were 17 when this was written;
# the bound leaves room for a new transitive dependency, not for a service's.
MOST_PACKAGES = 20


def _run(*command: str | Path, env: dict[str, str] | None = None, check: bool = True):
    # Run away from the tree: `python -m` puts the working directory on sys.path, and the
    # tree's own jobqueue.egg-info would stand in for the installed metadata.
    done = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    if check:
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the base install's bin directory, the wheel)."""
    venv = installed_venv(tmp_path_factory.mktemp("wheel") / "venv")
    return venv / "bin", wheel()


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would let the tree's own code or virtualenv
    stand in for the installed package."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, **extra}


def _packages(bin: Path) -> set[str]:
    listed = _run(UV, "pip", "list", "--python", bin / "python", "--format", "json").stdout
    return {entry["name"].lower() for entry in json.loads(listed)}


def test_the_base_install_leaves_out_the_services_dependencies(installed):
    bin, _ = installed
    packages = _packages(bin)
    print(f"base install: {len(packages)} packages: {sorted(packages)}")
    assert "jobqueue" in packages
    assert packages & SERVER_ONLY == set()
    assert len(packages) <= MOST_PACKAGES, sorted(packages)


def test_the_client_enqueue_and_the_command_line_work_from_the_base_install(installed):
    bin, _ = installed
    code = (
        "import sys, jobcore\n"
        "jobcore.enqueue, jobcore.enqueue_many\n"
        "from jobcore.client import AsyncClient, Client\n"
        "import jobcore.client.cli\n"
        "Client('http://127.0.0.1:1').close()\n"
        "print(jobcore.__file__)\n"
    )
    done = _run(bin / "python", "-c", code, env=_clean_env())
    assert "site-packages" in done.stdout  # the installed package, not this tree
    help = _run(bin / "jobqueue", "--help", env=_clean_env())
    assert "submit" in help.stdout and "wait" in help.stdout
    module = _run(bin / "python", "-m", "jobcore.client", "submit", "--help", env=_clean_env())
    assert "--wait" in module.stdout


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (("jobqueue-api",), "jobqueue-api"),
        (("jobqueue-worker",), "jobqueue-worker"),
        (("python", "-m", "jobqueue_api"), "jobqueue-api"),
        (("python", "-m", "jobqueue_worker"), "jobqueue-worker"),
        (("jobqueue", "migrate"), "jobqueue migrate"),
        (("jobqueue", "migrate", "--check"), "jobqueue migrate"),
    ],
)
def test_the_services_and_migrations_without_the_server_extra_exit_2_naming_it(
    installed, command, name
):
    bin, _ = installed
    done = _run(bin / command[0], *command[1:], env=_clean_env(), check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{name}: the server dependencies are not installed (missing ")
    assert lines[0].endswith("install jobqueue[server]")
    assert "starlette" in lines[0] and "pydantic" in lines[0]


def test_enqueue_commits_a_job_with_the_base_install_and_a_driver(installed, database_url):
    """The base install and the psycopg extra: enqueue on a SQLAlchemy connection really
    writes the job (nothing of the services' dependencies is needed at run time)."""
    bin, wheel = installed
    requirement = f"jobqueue[psycopg] @ {wheel.as_uri()}"
    _run(UV, "pip", "install", "-q", "--python", bin / "python", requirement)
    assert _packages(bin) & SERVER_ONLY == {"psycopg", "psycopg-binary"}
    code = (
        "import sys, sqlalchemy as sa\n"
        "from jobcore import enqueue\n"
        "engine = sa.create_engine(sys.argv[1].replace('postgresql://', 'postgresql+psycopg://'))\n"
        "with engine.begin() as conn:\n"
        "    print(enqueue(conn, 'sleep', {'duration': '1s'}, queue='mail'))\n"
        "assert not {'pydantic', 'asyncpg', 'starlette'} & set(sys.modules)\n"
    )
    done = _run(bin / "python", "-c", code, database_url, env=_clean_env())
    job_id = done.stdout.strip()
    # The table as jobcore declares it, wherever its schema puts it.
    engine = sa.create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            query = sa.select(jobs.c.type, jobs.c.queue, jobs.c.status).where(jobs.c.id == job_id)
            row = conn.execute(query).one()
    finally:
        engine.dispose()
    assert tuple(row) == ("sleep", "mail", "pending")
