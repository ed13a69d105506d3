"""Settings per SPEC §7: defaults, Go-style durations, one clear error naming the variable."""

import pytest

from jobcore.errors import ConfigError
from jobcore.settings import load_settings, parse_addr, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("1.5s", 1.5), ("2s", 2), ("1m30s", 90), ("1h", 3600), ("3", 3),
     ("0.25", 0.25), ("250us", 0.00025), ("0s", 0)],
)  # fmt: skip
def test_durations_accept_go_style_and_plain_seconds(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "5 parsecs", "-1s", "1x", "s", "nan", "inf", "1m-3s"])
def test_bad_durations_are_rejected(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_defaults_match_the_spec():
    s = load_settings({})
    assert s.database_url == "postgresql://localhost:5432/jobqueue"
    assert (s.http_addr, s.metrics_addr) == (":8080", ":9090")
    assert (s.worker_processes, s.workers, s.max_attempts) == (1, 4, 5)
    assert (s.job_timeout, s.lease_duration, s.recovery_interval, s.poll_interval) == (
        30,
        60,
        30,
        1,
    )
    assert (s.backoff_base, s.backoff_max, s.shutdown_timeout, s.drain_delay) == (1, 300, 20, 0)
    assert s.max_body_bytes == 1_048_576 and s.webhook_allow_private is False
    assert s.handler_modules == [] and s.tokens == [] and s.log_level == "info"


def test_values_are_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("WORKERS", "16")
    monkeypatch.setenv("JOB_TIMEOUT", "1m")
    monkeypatch.setenv("LEASE_DURATION", "2m")
    monkeypatch.setenv("API_TOKENS", " a, b ,")
    monkeypatch.setenv("JOB_HANDLERS", "x.y, z")
    monkeypatch.setenv("LOG_LEVEL", "DEBUG")
    s = load_settings()
    assert (s.workers, s.job_timeout, s.lease_duration) == (16, 60, 120)
    assert s.tokens == ["a", "b"] and s.handler_modules == ["x.y", "z"] and s.log_level == "debug"


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"WORKERS": "0"}, "WORKERS"),
        ({"WORKERS": "many"}, "WORKERS"),
        ({"WORKER_PROCESSES": "-1"}, "WORKER_PROCESSES"),
        ({"MAX_ATTEMPTS": "101"}, "MAX_ATTEMPTS"),
        ({"JOB_TIMEOUT": "soon"}, "JOB_TIMEOUT"),
        ({"POLL_INTERVAL": "0s"}, "POLL_INTERVAL"),
        ({"HTTP_ADDR": "localhost"}, "HTTP_ADDR"),
        ({"METRICS_ADDR": ":99999"}, "METRICS_ADDR"),
        ({"DATABASE_URL": "mysql://db/x"}, "DATABASE_URL"),
        ({"LOG_LEVEL": "loud"}, "LOG_LEVEL"),
        ({"WEBHOOK_ALLOW_PRIVATE": "perhaps"}, "WEBHOOK_ALLOW_PRIVATE"),
        ({"MAX_BODY_BYTES": "lots"}, "MAX_BODY_BYTES"),
        ({"BACKOFF_BASE": "10s", "BACKOFF_MAX": "1s"}, "BACKOFF_MAX"),
    ],
)
def test_bad_values_name_the_variable(env, variable):
    with pytest.raises(ConfigError) as caught:
        load_settings(env)
    assert caught.value.variable == variable
    assert str(caught.value).startswith(f"{variable}: ")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("job_timeout", "lease", "ok"),
    [("30s", "35s", False), ("30s", "35.5s", True), ("30s", "1m", True), ("1m", "1m", False)],
)
def test_lease_must_exceed_job_timeout_plus_five_seconds(job_timeout, lease, ok):
    env = {"JOB_TIMEOUT": job_timeout, "LEASE_DURATION": lease}
    if ok:
        load_settings(env)
    else:
        with pytest.raises(ConfigError) as caught:
            load_settings(env)
        assert caught.value.variable == "LEASE_DURATION"
        assert "JOB_TIMEOUT" in caught.value.message


def test_postgres_scheme_aliases_are_accepted():
    assert load_settings({"DATABASE_URL": "postgres://u@h/db"}).database_url.startswith("postgres")


@pytest.mark.parametrize(
    ("addr", "parsed"),
    [(":8080", ("0.0.0.0", 8080)), ("127.0.0.1:80", ("127.0.0.1", 80)), ("[::1]:9", ("::1", 9))],
)
def test_listen_addresses(addr, parsed):
    assert parse_addr(addr) == parsed
