"""jobqueue inside a team's own application, from the installed wheel: the application has its
own Alembic project and its own handler package; `jobqueue migrate` puts jobqueue's objects in
their own schema beside the application's; the API runs without any handler code (it learns
the type, and the handler's options, from what the worker recorded); the job completes."""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.packaging import installed_venv
from tests.procs import Service, free_port, wait_for

pytestmark = pytest.mark.e2e

HANDLERS = '''
"""The application's jobs."""

from jobcore import handler


@handler("myapp.greet", queue="mail", max_attempts=2)
def greet(payload, ctx):
    return {"greeting": f"hello {payload['name']}", "attempt": ctx.attempt}
'''

ALEMBIC_INI = """
[alembic]
script_location = %(here)s/migrations
"""

# What `alembic init` writes, reduced to its online mode: default settings throughout (the
# version table in the default schema, autogenerate over the default schema only).
ALEMBIC_ENV = """
import os

import sqlalchemy as sa
from alembic import context

metadata = sa.MetaData()
sa.Table("orders", metadata, sa.Column("id", sa.Integer, primary_key=True))
# An application may well have a table of its own named like one of jobqueue's.
sa.Table("jobs", metadata, sa.Column("id", sa.Integer, primary_key=True))

engine = sa.create_engine(os.environ["APP_DATABASE_URL"])
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()
"""

ALEMBIC_REVISION = '''
"""orders"""

import sqlalchemy as sa
from alembic import op

revision = "a1"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("orders", sa.Column("id", sa.Integer, primary_key=True))
    op.create_table("jobs", sa.Column("id", sa.Integer, primary_key=True))


def downgrade():
    op.drop_table("jobs")
    op.drop_table("orders")
'''


def _write_application(root: Path) -> Path:
    app = root / "app"
    (app / "myapp").mkdir(parents=True)
    (app / "myapp" / "__init__.py").write_text("")
    (app / "myapp" / "jobs.py").write_text(textwrap.dedent(HANDLERS))
    (app / "alembic.ini").write_text(ALEMBIC_INI)
    (app / "migrations" / "versions").mkdir(parents=True)
    (app / "migrations" / "env.py").write_text(ALEMBIC_ENV)
    (app / "migrations" / "script.py.mako").write_text("")
    (app / "migrations" / "versions" / "a1_orders.py").write_text(ALEMBIC_REVISION)
    return app


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        command, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{command}: {done.stdout}\n{done.stderr}"
    return done


def test_an_application_installs_migrates_and_runs_its_own_handler(
    empty_database_url: str, tmp_path: Path
) -> None:
    venv = installed_venv(tmp_path / "venv", extras="server", also=["psycopg[binary]"])
    app = _write_application(tmp_path)
    sync_url = empty_database_url.replace("postgresql://", "postgresql+psycopg://", 1)
    app_env = {"APP_DATABASE_URL": sync_url, "PYTHONPATH": str(app)}
    ours = {"DATABASE_URL": empty_database_url, "PYTHONPATH": ""}

    # The application's own migrations first, then jobqueue's, then the application's again:
    # each keeps its own version table, and neither sees the other's revisions.
    _run([str(venv / "bin" / "alembic"), "upgrade", "head"], app, app_env)
    _run([str(venv / "bin" / "jobqueue"), "migrate"], tmp_path, ours)
    _run([str(venv / "bin" / "jobqueue"), "migrate", "--check"], tmp_path, ours)
    _run([str(venv / "bin" / "alembic"), "upgrade", "head"], app, app_env)
    _run([str(venv / "bin" / "alembic"), "check"], app, app_env)  # autogenerate: no change
    with psycopg.connect(empty_database_url) as conn:
        public = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            " ORDER BY 1"
        ).fetchall()
        assert [name for (name,) in public] == ["alembic_version", "jobs", "orders"]
        (revision,) = conn.execute("SELECT version_num FROM public.alembic_version").fetchone()
        assert revision == "a1"

    port = free_port()
    worker = Service(
        str(venv / "bin" / "jobqueue-worker"),
        {
            **ours,
            "PYTHONPATH": str(app),
            "JOB_HANDLERS": "myapp.jobs",
            "QUEUES": "default,mail",  # the handler's queue
            "WORKER_PROCESSES": "1",
            "METRICS_ADDR": f"127.0.0.1:{free_port()}",
            "PROMETHEUS_MULTIPROC_DIR": "",
            "POLL_INTERVAL": "0.2s",
        },
    )
    # No handler module, and nothing on its path that could import one.
    api = Service(str(venv / "bin" / "jobqueue-api"), {**ours, "HTTP_ADDR": f"127.0.0.1:{port}"})
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert api.proc.poll() is None, api.output()
            assert worker.proc.poll() is None, worker.output()
            try:
                return httpx.get(f"{base}/readyz", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, 60, "the API to become ready")

        def submitted() -> httpx.Response | None:
            answer = httpx.post(
                f"{base}/jobs",
                json={"type": "myapp.greet", "payload": {"name": "ada"}},
                timeout=10,
            )
            if answer.status_code == 400:  # not recorded by the worker yet
                assert "myapp.greet" in answer.text, answer.text
                return None
            return answer

        created = wait_for(submitted, 60, "the worker to record myapp.greet", interval=0.2)
        assert created.status_code == 201, created.text
        job = created.json()
        assert job["queue"] == "mail" and job["max_attempts"] == 2  # the handler's options

        deadline = time.monotonic() + 60
        while True:
            record = httpx.get(f"{base}/jobs/{job['id']}?wait=10s", timeout=20).json()
            if record["status"] == "completed" or time.monotonic() > deadline:
                break
        assert record["status"] == "completed", record
        assert record["result"] == {"greeting": "hello ada", "attempt": 1}
    finally:
        for service in (api, worker):
            if service.proc.poll() is None:
                service.stop(30)
