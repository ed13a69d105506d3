"""The examples in examples/ run as written against a real `jobqueue-api` and worker (whose
JOB_HANDLERS include the examples' `receipts` module), and do what they say."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.e2e.test_api_process import Api
from tests.worker.support import ROOT, Worker, start_worker

pytestmark = pytest.mark.e2e

EXAMPLES = ROOT / "examples"
HANDLERS = {"JOB_HANDLERS": "receipts", "PYTHONPATH": str(EXAMPLES)}


@pytest.fixture
def services(
    database_url: str, start_api: Callable[..., Api], tmp_path: Path
) -> Iterator[tuple[Api, Worker]]:
    worker = start_worker(database_url, tmp_path, WORKERS="16", **HANDLERS)
    try:
        yield start_api(**HANDLERS), worker
    finally:
        worker.stop()


def _run(example: str, database_url: str, api: Api, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url, "JOBQUEUE_URL": api.base}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / example), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _rows(database_url: str, sql: str) -> list[Any]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(sql).fetchall()


def test_order_with_receipt_commits_the_order_with_its_job_and_rolls_back_both(
    services: tuple[Api, Worker], database_url: str
):
    api, _ = services
    done = _run("order_with_receipt.py", database_url, api)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "payment declined: the order and its receipt job" in done.stdout
    assert "does not exist, as its order does not" in done.stdout
    orders = _rows(database_url, "SELECT id, email FROM example_orders")
    assert [email for _, email in orders] == ["ada@example.com"]
    jobs = _rows(database_url, "SELECT type, status, payload, result FROM jobqueue.jobs")
    assert jobs == [
        (
            "send_receipt",
            "completed",
            {"order_id": orders[0][0], "email": "ada@example.com"},
            {"to": "ada@example.com", "subject": f"Your order {orders[0][0]}"},
        )
    ]


def test_submit_and_wait_submits_in_batches_and_sees_every_job_complete(
    services: tuple[Api, Worker], database_url: str
):
    api, _ = services
    # Fewer than the example's default 10,000, to keep the test short; still two batches.
    done = _run("submit_and_wait.py", database_url, api, "--count", "1200")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "submitted 1200 jobs" in done.stdout and "{'created': 1200}" in done.stdout
    assert "all 1200 finished" in done.stdout and "{'completed': 1200}" in done.stdout
    assert _rows(database_url, "SELECT status, count(*) FROM jobqueue.jobs GROUP BY status") == [
        ("completed", 1200)
    ]
