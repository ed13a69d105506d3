"""Every setting is also read as `JOBQUEUE_<NAME>`; the prefixed name wins when both are set,
and an error names the variable actually read (docs/configuration.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jobcore import environ
from jobcore.errors import ConfigError
from jobcore.registry import load_handlers
from jobcore.settings import load_api_settings, load_worker_settings
from jobcore.transactional import _default_max_attempts


def test_a_prefixed_setting_is_read_alone():
    assert load_worker_settings({"JOBQUEUE_WORKERS": "7"}).workers == 7
    assert load_api_settings({"JOBQUEUE_HTTP_ADDR": "127.0.0.1:81"}).http_addr.port == 81


@pytest.mark.parametrize(
    "env",
    [
        {"WORKERS": "3", "JOBQUEUE_WORKERS": "9"},
        {"JOBQUEUE_WORKERS": "9", "WORKERS": "3"},  # whatever the environment's order
        {"workers": "3", "jobqueue_workers": "9"},  # names match in any case
    ],
)
def test_the_prefixed_name_wins_when_both_are_set(env):
    assert load_worker_settings(env).workers == 9
    assert environ.getenv("WORKERS", environ=env) == "9"


def test_a_prefixed_empty_value_still_wins():
    # Set means present: an empty JOBQUEUE_API_TOKENS turns the bare one's tokens off.
    settings = load_api_settings({"API_TOKENS": "a,b", "JOBQUEUE_API_TOKENS": ""})
    assert settings.api_tokens == []


def test_the_bare_name_still_works_and_unknown_prefixed_names_are_ignored():
    settings = load_worker_settings({"WORKERS": "3", "JOBQUEUE_URL": "http://x", "JOBQUEUE_": ""})
    assert settings.workers == 3


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"JOBQUEUE_WORKERS": "0"}, "JOBQUEUE_WORKERS"),
        ({"WORKERS": "4", "JOBQUEUE_WORKERS": "0"}, "JOBQUEUE_WORKERS"),
        ({"WORKERS": "0", "JOBQUEUE_WORKERS": "4"}, None),  # the bare one is not read
        ({"WORKERS": "0"}, "WORKERS"),
        ({"jobqueue_lease_duration": "2s"}, "JOBQUEUE_LEASE_DURATION"),
        ({"JOBQUEUE_DATABASE_URL": "mysql://x/y"}, "JOBQUEUE_DATABASE_URL"),
    ],
)
def test_errors_name_the_variable_actually_read(env, variable):
    if variable is None:
        assert load_worker_settings(env).workers == 4
        return
    with pytest.raises(ConfigError) as caught:
        load_worker_settings(env)
    assert caught.value.variable == variable
    assert str(caught.value).startswith(f"{variable}: ")


def test_a_relation_names_both_variables_as_read():
    env = {"JOBQUEUE_BACKOFF_BASE": "10s", "BACKOFF_MAX": "1s"}
    with pytest.raises(ConfigError) as caught:
        load_worker_settings(env)
    assert caught.value.variable == "BACKOFF_MAX"
    assert "JOBQUEUE_BACKOFF_BASE" in caught.value.message


def test_job_handlers_errors_name_the_prefixed_variable(monkeypatch):
    monkeypatch.setenv("JOBQUEUE_JOB_HANDLERS", "no_such_module_anywhere")
    with pytest.raises(ConfigError) as caught:
        load_handlers(["no_such_module_anywhere"])
    assert caught.value.variable == "JOBQUEUE_JOB_HANDLERS"


def test_transactional_enqueue_reads_the_prefixed_max_attempts(monkeypatch):
    monkeypatch.setenv("MAX_ATTEMPTS", "3")
    monkeypatch.setenv("JOBQUEUE_MAX_ATTEMPTS", "8")
    assert _default_max_attempts() == 8
    monkeypatch.setenv("JOBQUEUE_MAX_ATTEMPTS", "0")
    with pytest.raises(ConfigError) as caught:
        _default_max_attempts()
    assert caught.value.variable == "JOBQUEUE_MAX_ATTEMPTS"
    monkeypatch.delenv("JOBQUEUE_MAX_ATTEMPTS")
    monkeypatch.delenv("MAX_ATTEMPTS")
    assert _default_max_attempts() == 5


def test_the_migrations_read_the_prefixed_database_url(tmp_path):
    # alembic's env.py: a bad prefixed URL is refused naming that variable, even when a good
    # bare one is set.
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": ":".join(sys.path),
        "DATABASE_URL": "postgresql://127.0.0.1:5432/postgres",
        "JOBQUEUE_DATABASE_URL": "postgresql://127.0.0.1:5432/x?sslmode=sometimes",
    }
    from tests.worker.support import ROOT

    done = subprocess.run(
        [sys.executable, "-m", "alembic", "current"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "invalid configuration: JOBQUEUE_DATABASE_URL: sslmode" in done.stderr, done.stderr


def test_every_environment_read_goes_through_jobcore_environ():
    """No module reads a setting from os.environ by itself: only these names, which are not
    settings (other programs' variables, the API's own inherited socket, the client's
    JOBQUEUE_URL/JOBQUEUE_TOKEN), are read directly."""
    import re

    from tests.worker.support import ROOT

    allowed = {
        "PROMETHEUS_MULTIPROC_DIR",
        "JOBQUEUE_URL",
        "JOBQUEUE_TOKEN",
        "JOBQUEUE_EMBEDDED",
        "TEST_DATABASE_URL",  # the tests' server, not a setting
    }
    reads = re.compile(
        r"""(?:os\.environ(?:\.get)?|os\.getenv|environ\.get)\(\s*["']([A-Z_]+)["']"""
    )
    offenders = []
    paths = [*(ROOT / "shared").rglob("*.py"), *(ROOT / "services").rglob("*.py")]
    paths += [
        ROOT / "migrations" / "env.py",
        ROOT / "scripts" / "run.py",
        ROOT / "scripts" / "devdb.py",
    ]
    for path in paths:
        for name in reads.findall(path.read_text()):
            if name not in allowed and not name.startswith("OTEL_"):
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []
