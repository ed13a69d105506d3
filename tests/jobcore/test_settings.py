"""Settings as documented (docs/configuration.md): defaults, Go-style durations, one clear
error naming the variable; each service reads the shared variables and its own, and ignores
the other's."""

import string
import urllib.parse
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobcore.db import SUPPORTED_PARAMETERS, connect_args
from jobcore.durations import format_duration, parse_duration
from jobcore.errors import ConfigError
from jobcore.settings import (
    DURATION_LIMITS,
    Address,
    ApiSettings,
    SharedSettings,
    WorkerSettings,
    load_api_settings,
    load_worker_settings,
    parse_addr,
)

LOADERS = {ApiSettings: load_api_settings, WorkerSettings: load_worker_settings}


def loaders_of(variable: str) -> list[Any]:
    """The loaders of the services that read `variable`: both for a shared one."""
    return [load for cls, load in LOADERS.items() if variable.lower() in cls.model_fields]


def load_for(variable: str, env: dict[str, str]) -> Any:
    """`env` loaded by a service that reads `variable` (the worker, for a shared one)."""
    return loaders_of(variable)[-1](env)


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


def test_defaults_are_the_documented_ones():
    for s in (load_api_settings({}), load_worker_settings({})):
        assert s.database_url == "postgresql://localhost:5432/jobqueue"
        assert (s.max_attempts, s.shutdown_timeout) == (5, 20)
        assert s.job_handlers == [] and s.log_level == "info"
    api = load_api_settings({})
    assert api.http_addr == ("0.0.0.0", 8080) and str(api.http_addr) == "0.0.0.0:8080"
    assert api.api_tokens == [] and api.drain_delay == 0
    assert api.max_body_bytes == 1_048_576
    assert (api.request_body_timeout, api.max_connections, api.api_processes) == (10, 2048, 1)
    w = load_worker_settings({})
    assert w.metrics_addr == Address("0.0.0.0", 9090)
    assert (w.worker_processes, w.workers, w.queues) == (1, 4, {"default": 4})
    assert (w.job_timeout, w.lease_duration, w.recovery_interval, w.poll_interval) == (
        30,
        30,
        30,
        1,
    )
    assert (w.backoff_base, w.backoff_max) == (1, 300) and w.webhook_allow_private is False
    assert (w.type_concurrency, w.type_rate) == ({}, {})


def test_values_are_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("WORKERS", "16")
    monkeypatch.setenv("JOB_TIMEOUT", "1m")
    monkeypatch.setenv("LEASE_DURATION", "2m")
    monkeypatch.setenv("API_TOKENS", " a, b ,")
    monkeypatch.setenv("JOB_HANDLERS", "x.y, z")
    monkeypatch.setenv("LOG_LEVEL", "DEBUG")
    s = load_worker_settings()
    assert (s.workers, s.job_timeout, s.lease_duration) == (16, 60, 120)
    assert s.job_handlers == ["x.y", "z"] and s.log_level == "debug"
    api = load_api_settings()
    assert api.api_tokens == ["a", "b"] and api.job_handlers == ["x.y", "z"]


def test_a_given_environment_is_read_alone(monkeypatch):
    monkeypatch.setenv("WORKERS", "16")
    monkeypatch.setenv("MAX_BODY_BYTES", "100")
    assert load_worker_settings({}).workers == 4
    assert load_api_settings({}).max_body_bytes == 1_048_576


def test_queues_are_parsed_once_with_workers_slots_for_a_name_alone():
    s = load_worker_settings({"WORKERS": "7", "QUEUES": " default, bulk:2 "})
    assert s.queues == {"default": 7, "bulk": 2}
    assert load_worker_settings({"WORKERS": "3"}).queues == {"default": 3}


@pytest.mark.parametrize(
    ("value", "says"),
    [("Big", "queue name 'Big'"), ("a,a", "listed twice"), ("a:0", "from 1 to 10000"),
     ("a:10001", "from 1 to 10000"), ("", "queue name ''")],
)  # fmt: skip
def test_invalid_queues_name_the_variable(value, says):
    with pytest.raises(ConfigError) as caught:
        load_worker_settings({"QUEUES": value})
    assert caught.value.variable == "QUEUES" and says in caught.value.message


def test_a_service_ignores_the_other_services_variables_even_invalid_ones():
    """One environment file may serve both services: each checks only what it reads."""
    worker_only = {"WORKERS": "0", "QUEUES": "Big", "LEASE_DURATION": "1s", "TYPE_RATE": "x"}
    api_only = {"HTTP_ADDR": "nowhere", "MAX_PENDING": "0", "API_TOKENS": "t", "DRAIN_DELAY": "9h"}
    assert load_api_settings(worker_only) == load_api_settings({})
    assert load_worker_settings(api_only) == load_worker_settings({})
    shared = set(SharedSettings.model_fields)
    assert set(ApiSettings.model_fields) & set(WorkerSettings.model_fields) == shared
    assert {"database_url", "log_level", "job_handlers", "max_attempts"} <= shared


def test_secrets_stay_out_of_reprs():
    url = "postgresql://u:s3cret@db.example/jobs"
    api = load_api_settings({"API_TOKENS": "tok-one,tok-two", "DATABASE_URL": url})
    assert api.api_tokens == ["tok-one", "tok-two"] and api.database_url == url
    for text in (repr(api), str(api), repr(load_worker_settings({"DATABASE_URL": url}))):
        assert "tok-one" not in text and "s3cret" not in text


def test_the_listen_connections_use_database_listen_url_else_database_url():
    url, listen = "postgresql://u:s3cret@db.example/jobs", "postgresql://u:l1sten@db.direct/jobs"
    for load in (load_api_settings, load_worker_settings):
        assert load({"DATABASE_URL": url}).listen_url == url
        assert load({"DATABASE_URL": url, "DATABASE_LISTEN_URL": ""}).listen_url == url
        both = load({"DATABASE_URL": url, "DATABASE_LISTEN_URL": listen})
        assert both.listen_url == listen and both.database_url == url
        assert "l1sten" not in repr(both) and "l1sten" not in str(both)


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
        ({"DATABASE_LISTEN_URL": "mysql://db/x"}, "DATABASE_LISTEN_URL"),
        ({"DATABASE_LISTEN_URL": "postgresql://db/x?foo=1"}, "DATABASE_LISTEN_URL"),
        ({"LOG_LEVEL": "loud"}, "LOG_LEVEL"),
        ({"WEBHOOK_ALLOW_PRIVATE": "perhaps"}, "WEBHOOK_ALLOW_PRIVATE"),
        ({"MAX_BODY_BYTES": "lots"}, "MAX_BODY_BYTES"),
        ({"BACKOFF_BASE": "10s", "BACKOFF_MAX": "1s"}, "BACKOFF_MAX"),
        ({"MAX_CONNECTIONS": "0"}, "MAX_CONNECTIONS"),
        ({"REQUEST_BODY_TIMEOUT": "0s"}, "REQUEST_BODY_TIMEOUT"),
    ],
)
def test_bad_values_name_the_variable(env, variable):
    for load in loaders_of(variable):
        with pytest.raises(ConfigError) as caught:
            load(env)
        assert caught.value.variable == variable
        assert str(caught.value).startswith(f"{variable}: ")
        assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("job_timeout", "lease", "ok"),
    [("30s", "3s", True), ("1h", "3s", True), ("1s", "2.9s", False), ("1s", "0", False)],
)
def test_a_lease_is_at_least_three_seconds_whatever_job_timeout_is(job_timeout, lease, ok):
    """Heartbeats renew leases, so a job may run far longer than its lease."""
    env = {"JOB_TIMEOUT": job_timeout, "LEASE_DURATION": lease}
    if ok:
        load_worker_settings(env)
    else:
        with pytest.raises(ConfigError) as caught:
            load_worker_settings(env)
        assert caught.value.variable == "LEASE_DURATION"
        assert "at least 3s" in caught.value.message


def test_postgres_scheme_aliases_are_accepted():
    for load in (load_api_settings, load_worker_settings):
        assert load({"DATABASE_URL": "postgres://u@h/db"}).database_url.startswith("postgres")


@pytest.mark.parametrize(
    ("addr", "parsed"),
    [(":8080", ("0.0.0.0", 8080)), ("127.0.0.1:80", ("127.0.0.1", 80)), ("[::1]:9", ("::1", 9))],
)
def test_listen_addresses(addr, parsed):
    assert parse_addr(addr) == parsed
    assert load_api_settings({"HTTP_ADDR": addr}).http_addr == parsed
    assert load_worker_settings({"METRICS_ADDR": addr}).metrics_addr == parsed
    assert parse_addr(str(parse_addr(addr))) == parsed  # str() is an address again


# --- upper bounds of durations, and DATABASE_URL parameters -------------------------

DURATIONS = sorted(DURATION_LIMITS)


@pytest.mark.parametrize(
    ("variable", "value"),
    [("LEASE_DURATION", "1e13"), ("BACKOFF_MAX", "1e13"), ("JOB_TIMEOUT", "25h"),
     ("LEASE_DURATION", "49h"), ("POLL_INTERVAL", "2h"), ("RECOVERY_INTERVAL", "1h0.001s"),
     ("BACKOFF_BASE", "100000"), ("SHUTDOWN_TIMEOUT", "1e9"), ("DRAIN_DELAY", "61m"),
     ("REQUEST_BODY_TIMEOUT", "301s")],
)  # fmt: skip
def test_absurd_durations_are_refused_naming_the_variable(variable, value):
    env = {variable: value}
    if variable == "BACKOFF_BASE":
        env["BACKOFF_MAX"] = value
    with pytest.raises(ConfigError) as caught:
        load_for(variable, env)
    assert caught.value.variable == variable
    assert "at most" in caught.value.message


def test_every_duration_may_reach_its_limit():
    env = {name.upper(): format_duration(limit) for name, limit in DURATION_LIMITS.items()}
    loaded = [load_api_settings(env), load_worker_settings(env)]
    for name, limit in DURATION_LIMITS.items():
        owners = [s for s in loaded if name in type(s).model_fields]
        assert owners and all(getattr(s, name) == limit for s in owners), name


@pytest.fixture(scope="module")
def pg(pg_server: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_server, autocommit=True) as conn:
        yield conn


durations = st.one_of(
    st.floats(min_value=0, max_value=1e16, allow_nan=False),
    st.integers(min_value=0, max_value=10**16).map(str),
    st.lists(
        st.tuples(st.integers(0, 10**9), st.sampled_from(["ns", "us", "ms", "s", "m", "h"])),
        min_size=1,
        max_size=3,
    ).map(lambda parts: "".join(f"{n}{unit}" for n, unit in parts)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(DURATIONS), value=durations)
def test_any_accepted_duration_is_usable_as_a_postgresql_interval(pg, name, value):
    env = {name.upper(): value if isinstance(value, str) else repr(value)}
    # Keep the relations satisfied, so only the value under test can be refused.
    env.setdefault("LEASE_DURATION", "48h")
    if name == "backoff_base":
        env["BACKOFF_MAX"] = "24h"
    if name == "lease_duration":
        env["JOB_TIMEOUT"] = "1s"
    try:
        seconds = getattr(load_for(name, env), name)
    except ConfigError as exc:
        assert exc.variable == name.upper()
        return
    # How the store turns seconds into times (leases, retries), and asyncio timers.
    pg.execute(
        "SELECT now() + %s * interval '1 second', make_interval(secs => %s)", (seconds, seconds)
    ).fetchone()
    assert seconds <= DURATION_LIMITS[name]


TRANSLATED = ("connect_timeout", "application_name", "options")
parameter_names = st.one_of(
    st.sampled_from(SUPPORTED_PARAMETERS),
    st.sampled_from(["sslcompression", "keepalives", "gssencmode", "service", "client_encoding"]),
    st.text(alphabet=string.ascii_letters + "_", min_size=1, max_size=12),
)
parameter_values = st.one_of(
    st.sampled_from(
        ["disable", "allow", "prefer", "require", "verify-full", "read-write", "primary",
         "0", "1", "10", "-c statement_timeout=5", "TLSv1.2", "/no/such/file", "app", ""]
    ),
    st.text(max_size=20),
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(parameter_names, parameter_values), max_size=4))
def test_any_database_url_either_translates_or_is_refused_naming_the_parameter(params):
    query = urllib.parse.urlencode(params)
    url = "postgresql://u:s3cret@db.example:5432/jobs" + (f"?{query}" if query else "")
    try:
        settings_ = load_api_settings({"DATABASE_URL": url})
    except ConfigError as exc:
        assert exc.variable == "DATABASE_URL"
        assert any(
            f"'{name}'" in exc.message or f"{name}=" in exc.message or f"{name}:" in exc.message
            for name, _ in params
        ), exc.message
        assert "s3cret" not in str(exc) and "\n" not in str(exc)
        return
    args = connect_args(settings_.database_url)
    kept = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(args["dsn"]).query))
    assert set(kept) <= set(SUPPORTED_PARAMETERS) - {
        "connect_timeout",
        "application_name",
        "options",
    }
    assert args["dsn"].startswith("postgresql://u:s3cret@db.example:5432/jobs")
    assert isinstance(args["timeout"], float) and 0 < args["timeout"] <= 3600
    assert set(args["server_settings"]) <= {"application_name", "options"}


# --- retention ------------------------------------------------------------------------


def test_retention_defaults_keep_completed_a_day_failed_a_week_and_dead_letters_forever():
    s = load_worker_settings({})
    assert (s.retention_completed, s.retention_failed, s.retention_dead_letter) == (
        86_400,
        604_800,
        0,
    )


@pytest.mark.parametrize(
    ("value", "seconds"), [("0", 0), ("0s", 0), ("1s", 1), ("90m", 5400), ("720h", 2_592_000)]
)
@pytest.mark.parametrize(
    "variable", ["RETENTION_COMPLETED", "RETENTION_FAILED", "RETENTION_DEAD_LETTER"]
)
def test_a_retention_is_a_duration_and_zero_means_forever(variable, value, seconds):
    assert getattr(load_worker_settings({variable: value}), variable.lower()) == seconds


@pytest.mark.parametrize("value", ["soon", "-1h", "1d", "87601h", "1e12"])
@pytest.mark.parametrize(
    "variable", ["RETENTION_COMPLETED", "RETENTION_FAILED", "RETENTION_DEAD_LETTER"]
)
def test_a_bad_retention_names_its_variable(variable, value):
    with pytest.raises(ConfigError) as caught:
        load_worker_settings({variable: value})
    assert caught.value.variable == variable
    assert "\n" not in str(caught.value)
