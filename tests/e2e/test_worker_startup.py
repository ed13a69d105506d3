"""`jobqueue-worker` refuses to start on bad configuration or an old schema, clearly."""

from __future__ import annotations

import socket

import pytest

from tests.worker.support import start_worker

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"WORKERS": "many"}, "WORKERS"),
        ({"JOB_TIMEOUT": "30s", "LEASE_DURATION": "20s"}, "LEASE_DURATION"),
        ({"JOB_HANDLERS": "tests.worker.no_such_module"}, "JOB_HANDLERS"),
    ],
)
def test_invalid_configuration_prints_one_line_naming_the_variable_and_exits_2(
    database_url, tmp_path, env, variable
):
    worker = start_worker(database_url, tmp_path, **env)
    assert worker.wait(60) == 2
    (line,) = worker.logs()
    assert line["level"] == "error"
    assert variable in line["msg"] and line["variable"] == variable


def test_schema_not_at_head_exits_non_zero_naming_alembic_upgrade_head(
    empty_database_url, tmp_path
):
    worker = start_worker(empty_database_url, tmp_path)
    assert worker.wait(60) != 0
    assert any("alembic upgrade head" in line["msg"] for line in worker.logs())
    assert not worker.messages("worker started")


def test_a_taken_metrics_port_is_reported_before_anything_starts(database_url, tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        worker = start_worker(database_url, tmp_path, METRICS_ADDR=f"127.0.0.1:{port}")
        assert worker.wait(60) != 0
    assert any(line.get("variable") == "METRICS_ADDR" for line in worker.logs())
    assert not worker.messages("worker started")
