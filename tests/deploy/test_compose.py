"""deploy/compose.yaml as the Compose binary resolves it."""

from __future__ import annotations

from typing import Any

from jobcore.durations import parse_duration
from jobcore.settings import (
    ApiSettings,
    WorkerSettings,
    load_api_settings,
    load_worker_settings,
    parse_addr,
)
from tests.deploy.script import validate_deploy

SETTING_NAMES = {name.upper() for name in (*ApiSettings.model_fields, *WorkerSettings.model_fields)}


def test_compose_resolves_with_database_migration_api_and_worker(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"postgres", "migrate", "api", "worker"}


def test_postgres_16_has_a_healthcheck_and_a_named_volume(compose: dict[str, Any]) -> None:
    postgres = compose["services"]["postgres"]
    assert postgres["image"].split(":")[1].startswith("16")
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    (volume,) = postgres["volumes"]
    assert volume["type"] == "volume"
    assert volume["source"] in compose["volumes"]
    assert volume["target"] == "/var/lib/postgresql/data"


def test_migration_runs_once_after_postgres_is_healthy(compose: dict[str, Any]) -> None:
    migrate = compose["services"]["migrate"]
    assert migrate["command"] == ["jobqueue", "migrate"]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert migrate.get("restart", "no") == "no"


def test_api_and_worker_start_only_after_migration_completed(compose: dict[str, Any]) -> None:
    for name, command in (("api", ["jobqueue-api"]), ("worker", ["jobqueue-worker"])):
        service = compose["services"][name]
        assert service["command"] == command
        assert service["depends_on"] == {
            "migrate": {"condition": "service_completed_successfully", "required": True}
        }


def test_one_image_serves_every_role(compose: dict[str, Any]) -> None:
    services = compose["services"]
    images = {services[name]["image"] for name in ("migrate", "api", "worker")}
    builds = {services[name]["build"]["dockerfile"] for name in ("migrate", "api", "worker")}
    assert len(images) == 1
    assert builds == {"deploy/Dockerfile"}


def test_api_publishes_8080_where_it_listens(compose: dict[str, Any]) -> None:
    api = compose["services"]["api"]
    _, port = parse_addr(api["environment"]["HTTP_ADDR"])
    assert [(p["target"], p.get("published")) for p in api["ports"]] == [(port, "8080")]


def test_worker_scales_out_without_collisions(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    _, port = parse_addr(worker["environment"]["METRICS_ADDR"])
    assert port == 9090
    assert "container_name" not in worker
    # A fixed host port would make `--scale worker=3` fail on the second replica.
    assert [(p["target"], p.get("published")) for p in worker["ports"]] == [(9090, None)]


def test_worker_metrics_folder_is_a_fresh_tmpfs(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    folder = worker["environment"]["PROMETHEUS_MULTIPROC_DIR"]
    assert folder in {entry.split(":")[0] for entry in worker["tmpfs"]}


def test_stop_grace_period_exceeds_shutdown_timeout_plus_drain_delay(
    compose: dict[str, Any],
) -> None:
    for name in ("api", "worker"):
        service = compose["services"][name]
        env = service["environment"]
        needed = parse_duration(env["SHUTDOWN_TIMEOUT"]) + parse_duration(env["DRAIN_DELAY"])
        assert parse_duration(service["stop_grace_period"]) > needed + 5, name


def test_settings_use_the_services_variable_names_and_load(compose: dict[str, Any]) -> None:
    for name in ("api", "worker", "migrate"):
        env = compose["services"][name]["environment"]
        assert set(env) - SETTING_NAMES <= {"PROMETHEUS_MULTIPROC_DIR"}, name
        # Both services read one environment file fine; each raises ConfigError naming the
        # variable at fault.
        load_api_settings(env)
        load_worker_settings(env)


def test_settings_can_be_overridden_from_the_shell() -> None:
    compose = validate_deploy.compose_config(
        {"WORKER_PROCESSES": "6", "API_TOKENS": "secret-a,secret-b", "POSTGRES_PASSWORD": "pw"}
    )
    services = compose["services"]
    assert services["worker"]["environment"]["WORKER_PROCESSES"] == "6"
    assert services["api"]["environment"]["API_TOKENS"] == "secret-a,secret-b"
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == "pw"
    for name in ("migrate", "api", "worker"):
        assert services[name]["environment"]["DATABASE_URL"].startswith("postgresql://jobqueue:pw@")


def test_both_services_take_database_listen_url_defaulting_to_database_url() -> None:
    url = "postgresql://jobqueue:pw@db1:5432,db2:5432/jobqueue?target_session_attrs=read-write"
    default = validate_deploy.compose_config({})["services"]
    chosen = validate_deploy.compose_config({"DATABASE_LISTEN_URL": url})["services"]
    for name, load in (("api", load_api_settings), ("worker", load_worker_settings)):
        env = default[name]["environment"]
        assert env["DATABASE_LISTEN_URL"] == ""
        assert load(env).listen_url == env["DATABASE_URL"]
        env = chosen[name]["environment"]
        assert env["DATABASE_LISTEN_URL"] == url
        assert load(env).listen_url == url
