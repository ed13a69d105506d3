"""The migrations ship inside the distribution (SPEC §18): a wheel built from this tree,
installed with its dependencies into a virtualenv of its own, migrates an empty database
with `jobqueue migrate`, finding its revisions in the installed package, not a checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import psycopg
import pytest

from jobcore.schema import SCHEMA_REVISION
from tests import pg

UV = Path(sys.executable).parent / "uv"
# What the build reads: the tree without what only the repository's own tests and tools use.
_LEFT_OUT = ("tests", "bench", "docs", "deploy", "examples", ".venv", ".devdb", "build")


def test_every_package_of_the_tree_is_in_the_distribution():
    """pyproject.toml lists the packages (the migrations are one under another name): a
    package added to the tree must be listed too."""
    with open(pg.ROOT / "pyproject.toml", "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    found = {"jobqueue_migrations"}
    for where in ("shared", "services/api", "services/worker"):
        for init in (pg.ROOT / where).rglob("__init__.py"):
            found.add(".".join(init.parent.relative_to(pg.ROOT / where).parts))
    assert listed == found


def _copy_tree(into: Path) -> None:
    files = subprocess.run(
        ["git", "-C", str(pg.ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in files:
        if name.split("/", 1)[0] in _LEFT_OUT or not (pg.ROOT / name).is_file():
            continue
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(pg.ROOT / name, target)


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_the_installed_wheel_migrates_an_empty_database(empty_database_url, tmp_path):
    if not UV.exists():
        pytest.skip("needs uv in the project's virtualenv")
    source, dist, venv = tmp_path / "src", tmp_path / "dist", tmp_path / "venv"
    _copy_tree(source)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run = {"env": env, "check": True, "capture_output": True, "text": True, "timeout": 180}
    subprocess.run([str(UV), "build", "--wheel", "-o", str(dist), str(source)], **run)
    (wheel,) = dist.glob("*.whl")
    subprocess.run([str(UV), "venv", "-q", "-p", sys.executable, str(venv)], **run)
    subprocess.run(
        [str(UV), "pip", "install", "-q", "-p", str(venv / "bin" / "python"), str(wheel)], **run
    )
    shutil.rmtree(source)  # nothing of a checkout is left to find
    migrate_env = {**env, "DATABASE_URL": empty_database_url}
    jobqueue = str(venv / "bin" / "jobqueue")
    done = subprocess.run(
        [jobqueue, "migrate"], env=migrate_env, cwd=tmp_path, capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (0, f"upgraded from none to {SCHEMA_REVISION}\n"), (
        done.stderr
    )
    check = subprocess.run(
        [jobqueue, "migrate", "--check"], env=migrate_env, capture_output=True, text=True
    )
    assert (check.returncode, check.stdout) == (0, f"at head: {SCHEMA_REVISION}\n")
    with psycopg.connect(empty_database_url) as conn:
        rows = conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind = 'r' AND n.nspname IN ('public', 'jobqueue')"
        ).fetchall()
    assert {schema for schema, _ in rows} == {"jobqueue"}
    assert {"jobs", "job_types", "alembic_version"} <= {name for _, name in rows}
