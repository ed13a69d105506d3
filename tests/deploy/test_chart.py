"""The Helm chart, rendered offline: what Kubernetes would be asked to run."""

from __future__ import annotations

import math
from typing import Any

import helm_python as helm
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobcore.durations import parse_duration
from jobcore.settings import (
    ApiSettings,
    WorkerSettings,
    load_api_settings,
    load_worker_settings,
    parse_addr,
)
from tests.deploy.script import validate_deploy

Manifest = dict[str, Any]
render = validate_deploy.render_chart
find = validate_deploy.find
SETTING_NAMES = {name.upper() for name in (*ApiSettings.model_fields, *WorkerSettings.model_fields)}
MARGIN = 15  # terminationGraceMarginSeconds in values.yaml


def rounded_up(seconds: float) -> range:
    """Whole seconds that round `seconds` up. Helm adds durations in decimal
    arithmetic, Python in binary floating point: allow for the last bit."""
    slack = 1e-9 * max(1.0, seconds)
    return range(math.ceil(seconds - slack), math.ceil(seconds + slack) + 1)


def only(manifests: list[Manifest], kind: str, name_suffix: str = "") -> Manifest:
    matches = [m for m in find(manifests, kind) if m["metadata"]["name"].endswith(name_suffix)]
    assert len(matches) == 1, f"expected one {kind} *{name_suffix}, found {len(matches)}"
    return matches[0]


def pod(manifest: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = manifest["spec"]["template"]["spec"]
    return spec


def container(manifest: Manifest) -> dict[str, Any]:
    (only_container,) = pod(manifest)["containers"]
    return only_container  # type: ignore[no-any-return]


def config_map(manifests: list[Manifest]) -> dict[str, str]:
    """The settings' ConfigMap (named after the release; the dashboard's has a suffix)."""
    (settings,) = [m for m in find(manifests, "ConfigMap") if m["metadata"]["name"] == "jobqueue"]
    data: dict[str, str] = settings["data"]
    return data


def hooks(manifest: Manifest) -> set[str]:
    annotation = manifest["metadata"].get("annotations", {}).get("helm.sh/hook", "")
    return {h.strip() for h in annotation.split(",") if h.strip()}


def hooks_of(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if hooks(m)]


def secret_refs(manifest: Manifest) -> set[str]:
    return {
        e["valueFrom"]["secretKeyRef"]["name"]
        for e in container(manifest).get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }


# ---- what runs --------------------------------------------------------------


def test_no_pod_replaces_the_images_entrypoint(default_manifests: list[Manifest]) -> None:
    # The image's ENTRYPOINT (tini) must stay PID 1 to forward SIGTERM and reap
    # orphans; the chart passes the command as args.
    workloads = find(default_manifests, "Deployment") + find(default_manifests, "Job")
    assert len(workloads) == 3
    assert all("command" not in container(w) for w in workloads)


@pytest.mark.parametrize("values", ["default", "production"])
def test_migration_runs_as_pre_install_and_pre_upgrade_hook_before_the_services(
    values: str, default_manifests: list[Manifest], production_manifests: list[Manifest]
) -> None:
    manifests = default_manifests if values == "default" else production_manifests
    job = only(manifests, "Job", "-migration")
    assert hooks(job) == {"pre-install", "pre-upgrade"}
    assert container(job)["args"] == ["jobqueue", "migrate"]
    assert pod(job)["restartPolicy"] == "Never"
    # Hooks run before the release's own objects exist: the Secret the Job reads
    # must be a hook created before it, or one the operator already has.
    (secret_name,) = secret_refs(job)
    hook_secrets = [s for s in find(manifests, "Secret") if hooks(s)]
    if values == "default":
        (hook_secret,) = hook_secrets
        assert hook_secret["metadata"]["name"] == secret_name
        assert hooks(hook_secret) == hooks(job)
        weight = int(hook_secret["metadata"]["annotations"]["helm.sh/hook-weight"])
        assert weight < int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
        assert "DATABASE_URL" in hook_secret["stringData"]
    else:
        assert hook_secrets == []
        assert secret_name == "jobqueue-database"
    # Nothing else is a hook, so the services are created after the migration.
    expected = ["Job", "Secret"] if values == "default" else ["Job"]
    assert sorted(m["kind"] for m in hooks_of(manifests)) == expected


def test_migration_hook_can_be_disabled() -> None:
    manifests = render({"migration": {"enabled": False}})
    assert find(manifests, "Job") == []
    assert hooks_of(manifests) == []


def test_two_deployments_run_the_api_and_the_worker(default_manifests: list[Manifest]) -> None:
    deployments = find(default_manifests, "Deployment")
    commands = sorted(container(d)["args"] for d in deployments)
    assert commands == [["jobqueue-api"], ["jobqueue-worker"]]
    assert only(default_manifests, "Deployment", "-api")["spec"]["replicas"] == 2
    assert only(default_manifests, "Deployment", "-worker")["spec"]["replicas"] == 2


@pytest.mark.parametrize(
    ("suffix", "listen_variable"), [("-api", "HTTP_ADDR"), ("-worker", "METRICS_ADDR")]
)
@pytest.mark.parametrize("values", ["default", "production"])
def test_probes_hit_healthz_and_readyz_on_the_port_the_service_listens_on(
    suffix: str,
    listen_variable: str,
    values: str,
    default_manifests: list[Manifest],
    production_manifests: list[Manifest],
) -> None:
    manifests = default_manifests if values == "default" else production_manifests
    main = container(only(manifests, "Deployment", suffix))
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    _, listening = parse_addr(config_map(manifests)[listen_variable])
    liveness, readiness = main["livenessProbe"]["httpGet"], main["readinessProbe"]["httpGet"]
    assert liveness["path"] == "/healthz"
    assert readiness["path"] == "/readyz"
    assert ports[liveness["port"]] == ports[readiness["port"]] == listening


def test_production_values_move_the_worker_metrics_port_everywhere(
    production_manifests: list[Manifest],
) -> None:
    assert config_map(production_manifests)["METRICS_ADDR"] == ":9100"
    worker = container(only(production_manifests, "Deployment", "-worker"))
    assert worker["ports"] == [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]
    service = only(production_manifests, "Service", "-worker-metrics")
    assert service["spec"]["ports"][0]["port"] == 9100


# ---- shutdown ---------------------------------------------------------------


def grace_periods(manifests: list[Manifest]) -> tuple[int, int]:
    api = pod(only(manifests, "Deployment", "-api"))["terminationGracePeriodSeconds"]
    worker = pod(only(manifests, "Deployment", "-worker"))["terminationGracePeriodSeconds"]
    return api, worker


@pytest.mark.parametrize(
    ("shutdown", "drain"),
    [("20s", "5s"), ("1m30s", "500ms"), (45, 0), ("2.5s", "0s"), ("1h", "1m"), ("0.25", ".5s")],
)
def test_grace_period_exceeds_the_shutdown_settings(shutdown: object, drain: object) -> None:
    manifests = render({"config": {"SHUTDOWN_TIMEOUT": shutdown, "DRAIN_DELAY": drain}})
    data = config_map(manifests)
    shutdown_s = parse_duration(data["SHUTDOWN_TIMEOUT"])
    drain_s = parse_duration(data["DRAIN_DELAY"])
    api, worker = grace_periods(manifests)
    assert worker in rounded_up(shutdown_s + MARGIN)
    assert api in rounded_up(drain_s + shutdown_s + MARGIN)


def test_default_grace_periods(default_manifests: list[Manifest]) -> None:
    # SHUTDOWN_TIMEOUT 20s, DRAIN_DELAY 5s, margin 15s.
    assert grace_periods(default_manifests) == (40, 35)


def test_grace_margin_comes_from_values() -> None:
    manifests = render({"terminationGraceMarginSeconds": 3})
    assert grace_periods(manifests) == (28, 23)


_number = st.one_of(
    st.integers(min_value=0, max_value=500).map(str),
    st.decimals(min_value=0, max_value=500, places=3).map(lambda d: f"{d:f}"),
)
_duration = st.one_of(
    _number,
    st.lists(
        st.tuples(_number, st.sampled_from(["h", "m", "s", "ms", "us", "ns"])),
        min_size=1,
        max_size=3,
    ).map(lambda parts: "".join(n + unit for n, unit in parts)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shutdown=_duration, drain=_duration)
def test_chart_reads_durations_exactly_as_the_services_do(shutdown: str, drain: str) -> None:
    api, worker = grace_periods(
        render({"config": {"SHUTDOWN_TIMEOUT": shutdown, "DRAIN_DELAY": drain}})
    )
    assert worker in rounded_up(parse_duration(shutdown) + MARGIN)
    assert api in rounded_up(parse_duration(drain) + parse_duration(shutdown) + MARGIN)


@pytest.mark.parametrize("bad", ["soon", "5 s", "-3s", "1d", ""])
def test_a_malformed_duration_stops_the_render(bad: str) -> None:
    with pytest.raises(helm.HelmError):
        render({"config": {"SHUTDOWN_TIMEOUT": bad}})


def test_a_misspelled_setting_stops_the_render() -> None:
    with pytest.raises(helm.HelmError, match="SHUTDOWN_TIMOUT"):
        render({"config": {"SHUTDOWN_TIMOUT": "30s"}})


# ---- settings ---------------------------------------------------------------


@pytest.mark.parametrize("values", ["default", "production"])
def test_rendered_settings_are_accepted_by_the_services(
    values: str, default_manifests: list[Manifest], production_manifests: list[Manifest]
) -> None:
    manifests = default_manifests if values == "default" else production_manifests
    data = config_map(manifests)
    assert set(data) <= SETTING_NAMES
    secrets = {s["metadata"]["name"]: s["stringData"] for s in find(manifests, "Secret")}
    for suffix, load in (("-api", load_api_settings), ("-worker", load_worker_settings)):
        main = container(only(manifests, "Deployment", suffix))
        env = dict(data)
        for entry in main["env"]:
            if "value" in entry:
                env[entry["name"]] = entry["value"]
            else:
                ref = entry["valueFrom"]["secretKeyRef"]
                stored = secrets.get(ref["name"], {"DATABASE_URL": "postgresql://db/jobqueue"})
                env[entry["name"]] = stored.get(ref["key"], "")
        loaded = load(env)  # raises ConfigError naming the variable at fault
        assert loaded.shutdown_timeout == parse_duration(data["SHUTDOWN_TIMEOUT"])


def test_api_tokens_reach_only_the_api(default_manifests: list[Manifest]) -> None:
    def names(suffix: str) -> set[str]:
        main = container(only(default_manifests, "Deployment", suffix))
        return {e["name"] for e in main["env"]}

    assert "API_TOKENS" in names("-api")
    assert "API_TOKENS" not in names("-worker")


LISTEN_URL = "postgresql://jobqueue:pw@db1:5432,db2:5432/jobqueue?target_session_attrs=read-write"


def _listen_urls(manifests: list[Manifest]) -> dict[str, str]:
    """Per service: DATABASE_LISTEN_URL as the pods would see it, from the chart's Secret
    (an optional reference to a key that is absent: empty)."""
    secrets = {s["metadata"]["name"]: s["stringData"] for s in find(manifests, "Secret")}
    urls = {}
    for suffix in ("-api", "-worker"):
        env = {e["name"]: e for e in container(only(manifests, "Deployment", suffix))["env"]}
        ref = env["DATABASE_LISTEN_URL"]["valueFrom"]["secretKeyRef"]
        # From the Secret of DATABASE_URL, and optional: a Secret of one's own need not have it.
        assert ref["name"] == env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"]
        assert ref["key"] == "DATABASE_LISTEN_URL" and ref["optional"] is True
        urls[suffix] = secrets.get(ref["name"], {}).get(ref["key"], "")
    return urls


def test_both_services_take_database_listen_url_from_the_secret_defaulting_to_database_url(
    default_manifests: list[Manifest],
) -> None:
    assert _listen_urls(default_manifests) == {"-api": "", "-worker": ""}
    manifests = render({"secret": {"databaseListenUrl": LISTEN_URL}})
    assert _listen_urls(manifests) == {"-api": LISTEN_URL, "-worker": LISTEN_URL}
    for suffix, load in (("-api", load_api_settings), ("-worker", load_worker_settings)):
        env = {"DATABASE_URL": "postgresql://pooler:6432/jobqueue", "DATABASE_LISTEN_URL": ""}
        assert load(env).listen_url == "postgresql://pooler:6432/jobqueue", suffix
        env["DATABASE_LISTEN_URL"] = _listen_urls(manifests)[suffix]
        assert load(env).listen_url == LISTEN_URL, suffix


def test_a_listen_url_that_is_not_postgres_stops_the_render() -> None:
    with pytest.raises(helm.HelmError, match="databaseListenUrl"):
        render({"secret": {"databaseListenUrl": "mysql://db/jobqueue"}})


def test_integer_settings_are_not_written_in_exponent_form(
    production_manifests: list[Manifest],
) -> None:
    data = config_map(production_manifests)
    assert data["MAX_BODY_BYTES"] == "2097152"
    assert data["WORKER_PROCESSES"] == "2"


def test_existing_secret_replaces_the_charts_secrets(production_manifests: list[Manifest]) -> None:
    assert find(production_manifests, "Secret") == []
    for suffix in ("-api", "-worker"):
        refs = secret_refs(only(production_manifests, "Deployment", suffix))
        assert refs == {"jobqueue-database"}


def test_config_change_rolls_the_pods() -> None:
    before = only(render(), "Deployment", "-worker")
    after = only(render({"config": {"WORKERS": 16}}), "Deployment", "-worker")
    annotation = "checksum/config"
    assert (
        before["spec"]["template"]["metadata"]["annotations"][annotation]
        != after["spec"]["template"]["metadata"]["annotations"][annotation]
    )


# ---- hardening --------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["-api", "-worker", "-migration"])
def test_pods_run_as_non_root_on_a_read_only_root_without_capabilities(
    suffix: str, default_manifests: list[Manifest]
) -> None:
    manifest = only(default_manifests, "Job" if suffix == "-migration" else "Deployment", suffix)
    spec, main = pod(manifest), container(manifest)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["automountServiceAccountToken"] is False
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert main["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # Every writable path is an emptyDir volume.
    empty_dirs = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
    mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
    assert mounts.get("/tmp") in empty_dirs
    assert set(mounts.values()) <= empty_dirs


def test_worker_metrics_folder_is_a_fresh_writable_volume(
    default_manifests: list[Manifest],
) -> None:
    worker = only(default_manifests, "Deployment", "-worker")
    env = {e["name"]: e.get("value") for e in container(worker)["env"]}
    folder = env["PROMETHEUS_MULTIPROC_DIR"]
    mounts = {m["mountPath"]: m["name"] for m in container(worker)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod(worker)["volumes"]}
    assert "emptyDir" in volumes[mounts[folder]]


# ---- scaling and availability -----------------------------------------------


def test_autoscaler_owns_the_worker_replica_count(production_manifests: list[Manifest]) -> None:
    worker = only(production_manifests, "Deployment", "-worker")
    hpa = only(production_manifests, "HorizontalPodAutoscaler")
    assert "replicas" not in worker["spec"]
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": worker["metadata"]["name"],
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    assert container(worker)["resources"]["requests"]["cpu"], "CPU utilization needs a request"


def test_no_autoscaler_by_default(default_manifests: list[Manifest]) -> None:
    assert find(default_manifests, "HorizontalPodAutoscaler") == []


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("suffix", ["-api", "-worker"])
def test_each_deployment_has_a_disruption_budget_selecting_only_its_pods(
    suffix: str, default_manifests: list[Manifest]
) -> None:
    deployments = find(default_manifests, "Deployment")
    budget = only(default_manifests, "PodDisruptionBudget", suffix)
    selected = [
        d["metadata"]["name"]
        for d in deployments
        if selects(
            budget["spec"]["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"]
        )
    ]
    assert selected == [only(default_manifests, "Deployment", suffix)["metadata"]["name"]]
    assert budget["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize(
    ("service", "deployment"), [("-api", "-api"), ("-worker-metrics", "-worker")]
)
def test_services_route_to_a_named_port_of_their_pods(
    service: str, deployment: str, default_manifests: list[Manifest]
) -> None:
    svc = only(default_manifests, "Service", service)
    target = only(default_manifests, "Deployment", deployment)
    assert selects(svc["spec"]["selector"], target["spec"]["template"]["metadata"]["labels"])
    names = {p["name"] for p in container(target)["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= names


def test_service_monitor_scrapes_the_api_and_every_worker(
    production_manifests: list[Manifest], default_manifests: list[Manifest]
) -> None:
    assert find(default_manifests, "ServiceMonitor") == []
    monitor = only(production_manifests, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    selector = monitor["spec"]["selector"]["matchLabels"]
    scraped = {
        (s["metadata"]["name"], p["name"])
        for s in find(production_manifests, "Service")
        if selects(selector, s["metadata"]["labels"])
        for p in s["spec"]["ports"]
        if p["name"] in {e["port"] for e in monitor["spec"]["endpoints"]}
    }
    assert scraped == {("jobqueue-api", "http"), ("jobqueue-worker-metrics", "metrics")}
    assert {e["path"] for e in monitor["spec"]["endpoints"]} == {"/metrics"}
