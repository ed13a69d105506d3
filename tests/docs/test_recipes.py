"""docs/recipes/ run as written, with the real frameworks: each page's modules (its Python
blocks whose first line names a file) written into a project folder, driven by FastAPI's
TestClient or Django's own calls in a process of their own, and their jobs run by real
`jobqueue-api` / `jobqueue-worker` processes on this test's database."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa

from jobcore.schema import jobs
from tests.e2e.test_api_process import Api
from tests.procs import Service, free_port, wait_for
from tests.worker.support import ROOT, start_worker

pytestmark = pytest.mark.e2e

RECIPES = ROOT / "docs" / "recipes"


def write_project(page: str, project: Path) -> list[str]:
    """Write the page's file blocks (`# path/to/file.py` first) under `project`, with the
    packages' __init__.py; returns the paths written."""
    text = (RECIPES / page).read_text()
    written = []
    for code in re.findall(r"```python\n(.*?)```", text, re.DOTALL):
        first = code.splitlines()[0]
        match = re.fullmatch(r"# ([\w/]+\.py)", first)
        if match is None:
            continue
        path = project / match.group(1)
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(code)
        written.append(match.group(1))
    return written


def python_path(project: Path) -> str:
    """The project first, then this interpreter's path (this tree's code included)."""
    return os.pathsep.join([str(project), *sys.path])


def drive(script: str, env: dict[str, str], cwd: Path) -> Any:
    """Run `script` in a Python process of its own (the frameworks' state stays out of the
    test process); the JSON it prints last."""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows(database_url: str, query: Any) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(query)]
    finally:
        engine.dispose()


FASTAPI_DRIVER = """
import json, time
from fastapi.testclient import TestClient
from myapp.main import app

out = {}
with TestClient(app, raise_server_exceptions=False) as client:
    answer = client.post("/signups", json={"email": "ada@example.com"})
    out["created"] = [answer.status_code, answer.json()]
    job_id = answer.json()["job_id"]
    deadline = time.monotonic() + 30
    while True:  # polls the recipe's own endpoint until the worker has run the job
        job = client.get(f"/jobs/{job_id}").json()
        if job["status"] == "completed" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    out["job"] = job
    out["twice"] = client.post("/signups", json={"email": "ada@example.com"}).status_code
    out["missing"] = client.get("/jobs/01a2353c-23de-7f1d-856b-fb6a40606b62").status_code
print(json.dumps(out))
"""


def test_the_fastapi_recipe(
    database_url: str, start_api: Callable[..., Api], tmp_path: Path
) -> None:
    pytest.importorskip("fastapi")
    project = tmp_path / "project"
    assert write_project("fastapi.md", project) == ["myapp/jobs.py", "myapp/main.py"]
    env = {"JOB_HANDLERS": "myapp.jobs", "PYTHONPATH": python_path(project)}
    worker = start_worker(database_url, tmp_path, **env)
    try:
        api = start_api(**env)
        out = drive(
            FASTAPI_DRIVER,
            {
                **env,
                "JOBQUEUE_URL": api.base,
                "APP_DATABASE_URL": database_url.replace("postgresql://", "postgresql+asyncpg://"),
            },
            project,
        )
    finally:
        worker.stop()
    assert out["created"][0] == 201
    assert out["job"] == {
        "status": "completed",
        "result": {"to": "ada@example.com", "subject": "Welcome!"},
    }
    # The second signup's insert failed: its transaction, job included, rolled back.
    assert out["twice"] == 500
    assert out["missing"] == 404
    assert rows(database_url, sa.select(jobs.c.type)) == [("welcome",)]
    assert rows(database_url, sa.text("SELECT email FROM signups")) == [("ada@example.com",)]


DJANGO_DRIVER = """
import json, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "myproject.settings")
import django
django.setup()
from django.core.management import call_command
call_command("migrate", run_syncdb=True, verbosity=0)

from django.db import connection, transaction
from jobcore import enqueue
from shop.models import Order
from shop.orders import place_order

order_id, job_id = place_order("ada@example.com")
try:
    with transaction.atomic():  # an order and its job, rolled back together
        order = Order.objects.create(email="bob@example.com")
        enqueue(connection, "send_receipt", {"order": order.pk})
        raise RuntimeError("payment declined")
except RuntimeError:
    pass
emails = list(Order.objects.values_list("email", flat=True))
print(json.dumps({"order": order_id, "job": job_id, "emails": emails}))
"""


def django_env(database_url: str, project: Path) -> dict[str, str]:
    """The recipe's settings' variables, pointed at this test's database."""
    url = urllib.parse.urlsplit(database_url)
    return {
        "DJANGO_SETTINGS_MODULE": "myproject.settings",
        "DB_NAME": url.path.lstrip("/"),
        "DB_HOST": url.hostname or "localhost",
        "DB_PORT": str(url.port or 5432),
        "DB_USER": url.username or "",
        "DB_PASSWORD": url.password or "",
        "PYTHONPATH": python_path(project),
    }


def test_the_django_recipe(database_url: str, tmp_path: Path) -> None:
    pytest.importorskip("django")
    project = tmp_path / "project"
    written = write_project("django.md", project)
    assert written == ["myproject/settings.py", "shop/models.py", "shop/jobs.py", "shop/orders.py"]
    env = django_env(database_url, project)
    out = drive(DJANGO_DRIVER, env, project)
    assert out["emails"] == ["ada@example.com"]
    assert rows(database_url, sa.select(jobs.c.id, jobs.c.status)) == [
        (UUID(out["job"]), "pending")
    ]

    # The worker, with the recipe's variables, imports shop.jobs (which sets Django up) and
    # runs the receipt through the ORM. This interpreter's worker: it has Django.
    port = free_port()
    worker = Service(
        str(Path(sys.executable).parent / "python"),
        {
            **env,
            "DATABASE_URL": database_url,
            "METRICS_ADDR": f"127.0.0.1:{port}",
            "JOB_HANDLERS": "shop.jobs",
            "WORKER_PROCESSES": "1",
            "POLL_INTERVAL": "0.2s",
            "PROMETHEUS_MULTIPROC_DIR": "",
        },
        args=["-m", "jobqueue_worker"],
    )
    try:

        def result() -> Any:
            assert worker.proc.poll() is None, worker.output()
            found = rows(database_url, sa.select(jobs.c.status, jobs.c.result))
            return found[0][1] if found and found[0][0] == "completed" else None

        done = wait_for(result, 60, "the receipt job to complete", interval=0.2)
    finally:
        assert worker.stop(60) == 0, worker.output()
    assert done == {"to": "ada@example.com", "subject": f"Your order {out['order']}"}
