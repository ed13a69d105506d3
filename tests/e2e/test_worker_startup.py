"""`jobqueue-worker` refuses to start on bad configuration or an old schema, clearly."""

from __future__ import annotations

import socket

import pytest
import sqlalchemy as sa

from jobcore.db import session_name
from tests.worker.support import all_in, eventually, start_worker, submit, until

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"WORKERS": "many"}, "WORKERS"),
        ({"LEASE_DURATION": "2s"}, "LEASE_DURATION"),
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


def test_schema_not_at_head_exits_non_zero_naming_jobqueue_migrate(empty_database_url, tmp_path):
    worker = start_worker(empty_database_url, tmp_path)
    assert worker.wait(60) != 0
    assert any("jobqueue migrate" in line["msg"] for line in worker.logs())
    assert not worker.messages("worker started")


def test_a_taken_metrics_port_is_reported_before_anything_starts(database_url, tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        worker = start_worker(database_url, tmp_path, METRICS_ADDR=f"127.0.0.1:{port}")
        assert worker.wait(60) != 0
    assert any(line.get("variable") == "METRICS_ADDR" for line in worker.logs())
    assert not worker.messages("worker started")


@pytest.mark.parametrize(
    ("env", "variable", "named"),
    [
        ({"LEASE_DURATION": "1e13"}, "LEASE_DURATION", "at most 48h"),
        ({"BACKOFF_MAX": "1e13"}, "BACKOFF_MAX", "at most 24h"),
        ({"DATABASE_URL": "?foo=bar"}, "DATABASE_URL", "'foo'"),
        ({"DATABASE_URL": "?sslcompression=1"}, "DATABASE_URL", "'sslcompression'"),
        ({"DATABASE_LISTEN_URL": "postgresql://h/db?foo=bar"}, "DATABASE_LISTEN_URL", "'foo'"),
    ],
)
def test_absurd_durations_and_unsupported_url_parameters_exit_2_with_one_line(
    database_url, tmp_path, env, variable, named
):
    if env.get("DATABASE_URL", "").startswith("?"):
        env = {"DATABASE_URL": database_url + env["DATABASE_URL"]}
    worker = start_worker(database_url, tmp_path, **env)
    assert worker.wait(60) == 2
    (line,) = worker.logs()
    assert line["level"] == "error" and line["variable"] == variable
    assert named in line["msg"]


async def test_a_database_url_with_libpq_parameters_runs_jobs(database_url, engine, tmp_path):
    url = (
        f"{database_url}?sslmode=prefer&connect_timeout=10&application_name=wk"
        "&options=-c%20lock_timeout%3D5s&target_session_attrs=read-write"
    )
    worker = start_worker(url, tmp_path)
    try:
        ids = await submit(engine, "test.record", count=3)
        await eventually(lambda: all_in(engine, ids, "completed"), 90, "the jobs to complete")
        await until(lambda: worker.messages("listening for wake-ups"), 30, "the listener")
        assert worker.status_of("/readyz") == 200  # the supervisor's connection too
        # Every connection of the worker took the URL's name ("jobqueue" is this test's).
        async with engine.connect() as conn:
            names = await conn.scalars(
                sa.text(
                    "SELECT application_name FROM pg_stat_activity"
                    " WHERE datname = current_database()"
                    f" AND application_name <> '{session_name()}'"
                )
            )
            assert set(names) == {"wk"}
    finally:
        assert worker.stop(60) == 0


async def test_a_handler_queue_the_worker_does_not_serve_is_warned_of_once(database_url, tmp_path):
    handlers = "tests.worker.handlers,tests.worker.handlers_options"
    worker = start_worker(database_url, tmp_path, JOB_HANDLERS=handlers)
    served = start_worker(database_url, tmp_path, JOB_HANDLERS=handlers, QUEUES="default,mail")
    try:
        await until(lambda: worker.child_pids() and served.child_pids(), 60, "both started")
        (line,) = [line for line in worker.logs() if "does not serve" in line.get("msg", "")]
        assert line["level"] == "warning"
        assert (line["type"], line["queue"]) == ("test.options.receipt", "mail")
        assert not [line for line in served.logs() if "does not serve" in line.get("msg", "")]
    finally:
        assert worker.stop(60) == 0 and served.stop(60) == 0
