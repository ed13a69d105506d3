"""Offline validation of everything under deploy/: one line per check, exit 1 on any failure.

No Docker engine, no helm binary, no cluster: hadolint lints the Dockerfile, the
Compose binary resolves compose.yaml, Helm's Go SDK (through helm-python-sdk)
lints and renders the chart with its default values and every ci/*-values.yaml, and
kubernetes-validate checks every rendered manifest strictly against the bundled
Kubernetes schemas; the custom resources the chart can write (ServiceMonitor,
PrometheusRule, KEDA's ScaledObject and TriggerAuthentication) are checked against
strict schemas of the parts it writes, below. The chart's copies of the alert rules and
the dashboard must equal deploy/prometheus/alerts.yaml and deploy/grafana/jobqueue.json.
The tests under tests/deploy/ reuse the rendering and parsing functions below.

    .venv/bin/python scripts/validate_deploy.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE_FILE = DEPLOY / "compose.yaml"
LOCK_FILE = DEPLOY / "requirements.lock"
CHART = DEPLOY / "helm" / "jobqueue"
PRODUCTION_VALUES = CHART / "ci" / "production-values.yaml"
# Files the chart renders from (Helm reads only inside the chart) and their sources.
CHART_COPIES = {
    CHART / "files" / "alerts.yaml": DEPLOY / "prometheus" / "alerts.yaml",
    CHART / "files" / "jobqueue.json": DEPLOY / "grafana" / "jobqueue.json",
}
# The image holds the runtime dependencies and these extras: the services, and tracing a
# setting away.
IMAGE_EXTRAS = ("server", "otel")
REGENERATE_LOCK = (
    "uv pip compile pyproject.toml -o deploy/requirements.lock"
    " --universal --python-version 3.11 --generate-hashes"
    + "".join(f" --extra {extra}" for extra in IMAGE_EXTRAS)
)

# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())

Manifest = dict[str, Any]


def tool(name: str) -> str:
    """Path of a console script installed next to this interpreter (the project's .venv)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed; run `make install`")
    return found


# ---- Dockerfile -------------------------------------------------------------


def hadolint_findings(dockerfile: Path = DOCKERFILE) -> list[str]:
    """hadolint's findings at every severity, style included; empty when clean."""
    result = subprocess.run(
        [tool("hadolint"), "--no-color", "--failure-threshold", "style", str(dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = (result.stdout + result.stderr).splitlines()
    if result.returncode != 0 and not lines:
        return [f"hadolint exited with {result.returncode}"]
    return lines


def dockerfile_instructions(dockerfile: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", dockerfile.read_text())
    pairs = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            pairs.append((keyword.upper(), rest.strip()))
    return pairs


# ---- requirements lock ------------------------------------------------------


def lock_pins(lock: Path = LOCK_FILE) -> tuple[dict[str, str], set[str]]:
    """({name: version} for every pin, names uv marked as required by pyproject.toml)."""
    pins: dict[str, str] = {}
    direct: set[str] = set()
    current = None
    for line in lock.read_text().splitlines():
        pin = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line)
        if pin:
            current = canonicalize_name(pin.group(1))
            pins[current] = pin.group(2)
        elif current and line.strip().startswith("#") and "(pyproject.toml)" in line:
            direct.add(current)
    return pins, direct


def lock_problems(pyproject: Path = ROOT / "pyproject.toml", lock: Path = LOCK_FILE) -> list[str]:
    """Why the lock no longer matches pyproject's runtime dependencies and the image's extras;
    empty when it does."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project.get("optional-dependencies", {})
    requirements = [
        Requirement(r)
        for r in [*project["dependencies"], *(d for e in IMAGE_EXTRAS for d in extras.get(e, []))]
    ]
    pins, direct = lock_pins(lock)
    problems = []
    wanted = {canonicalize_name(r.name) for r in requirements}
    for req in requirements:
        name = canonicalize_name(req.name)
        if name not in pins:
            problems.append(f"{req} is not pinned")
        elif not req.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{name}=={pins[name]} does not satisfy {req}")
        problems += [
            f"{name} (extra of {req}) is not pinned" for name in _extra_needs(req) - set(pins)
        ]
    problems += [
        f"{name} is locked as a direct dependency but not in pyproject"
        for name in sorted(direct - wanted)
    ]
    if problems:
        problems.append(f"regenerate: {REGENERATE_LOCK}")
    return problems


def _extra_needs(req: Requirement) -> set[str]:
    """Names an extra such as sqlalchemy[asyncio] adds, read from the installed distribution."""
    if not req.extras:
        return set()
    try:
        declared = metadata.requires(req.name) or []
    except metadata.PackageNotFoundError:
        return set()
    needs = set()
    for text in declared:
        dep = Requirement(text)
        wanted_by_extra = dep.marker is not None and any(
            dep.marker.evaluate({"extra": extra}) for extra in req.extras
        )
        if wanted_by_extra and not (dep.marker and dep.marker.evaluate({"extra": ""})):
            needs.add(canonicalize_name(dep.name))
    return needs


# ---- compose ----------------------------------------------------------------


def compose_config(
    env: dict[str, str] | None = None, compose_file: Path = COMPOSE_FILE
) -> dict[str, Any]:
    """The compose model as `docker compose config` resolves it (raises ValueError if it cannot).

    Runs with a minimal environment and an empty env file so the result depends
    on the file alone plus `env`.
    """
    base = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    result = subprocess.run(
        [
            tool("docker-compose"),
            "--env-file",
            os.devnull,
            "-f",
            str(compose_file),
            "config",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**base, **(env or {})},
    )
    if result.returncode != 0:
        raise ValueError(
            result.stderr.strip() or f"docker compose config exited with {result.returncode}"
        )
    config: dict[str, Any] = json.loads(result.stdout)
    return config


# ---- Helm chart -------------------------------------------------------------


def production_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(PRODUCTION_VALUES.read_text())
    return values


def ci_values() -> dict[str, dict[str, Any]]:
    """Every example configuration in the chart's ci/ folder, by file name."""
    return {
        f"ci/{path.name}": yaml.safe_load(path.read_text())
        for path in sorted((CHART / "ci").glob("*-values.yaml"))
    }


def copy_problems() -> list[str]:
    """Chart files that no longer equal the file they copy."""
    problems = []
    for copy, source in CHART_COPIES.items():
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            copy_name, source_name = copy.relative_to(ROOT), source.relative_to(ROOT)
            problems.append(f"{copy_name} differs from {source_name}: cp {source_name} {copy_name}")
    return problems


def lint_chart(values: dict[str, Any] | None = None) -> list[str]:
    """Helm lint findings in strict mode (warnings count); informational ones are ignored."""
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSIONS[0]}")
    found = [f"{m['path']}: {m['error'].strip()}" for m in report["messages"] if m["severity"] >= 2]
    return found + [e.strip() for e in report["errors"] if not any(e.strip() in f for f in found)]


def render_chart(
    values: dict[str, Any] | None = None, *, name: str = "jobqueue", namespace: str = "jobqueue"
) -> list[Manifest]:
    """Every manifest the chart renders (hooks included), as dictionaries, in template order."""
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=name, namespace=namespace, is_install=True)
    manifests = []
    for template in sorted(rendered):
        if template.endswith(".yaml"):
            manifests += [doc for doc in yaml.safe_load_all(rendered[template]) if doc]
    return manifests


def find(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


# Custom resources are absent from the bundled Kubernetes schemas: these are the parts of
# their schemas the chart writes, strict. The Prometheus Operator's ServiceMonitor:
_PROM_DURATION = {
    "type": "string",
    "pattern": (
        r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
    ),
}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "labels": _STRINGS, "annotations": _STRINGS},
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchLabels": _STRINGS},
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": _PROM_DURATION,
                            "scrapeTimeout": _PROM_DURATION,
                        },
                    },
                },
            },
        },
    },
}


def _crd(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The schema of a custom resource: the object's frame around `spec`, strict."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name"],
                "properties": {
                    "name": {"type": "string"},
                    "labels": _STRINGS,
                    "annotations": _STRINGS,
                },
            },
            "spec": spec,
        },
    }


def _strict(required: list[str], **properties: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": required,
        "properties": properties,
    }


# The Prometheus Operator's PrometheusRule (monitoring.coreos.com/v1): groups of rules.
PROMETHEUS_RULE_SCHEMA = _crd(
    "monitoring.coreos.com/v1",
    "PrometheusRule",
    _strict(
        ["groups"],
        groups={
            "type": "array",
            "minItems": 1,
            "items": _strict(
                ["name", "rules"],
                name={"type": "string", "minLength": 1},
                interval=_PROM_DURATION,
                rules={
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        **_strict(
                            ["expr"],
                            alert={"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
                            record={"type": "string"},
                            expr={"type": "string", "minLength": 1},
                            labels=_STRINGS,
                            annotations=_STRINGS,
                            keep_firing_for=_PROM_DURATION,
                            **{"for": _PROM_DURATION},
                        ),
                        "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                    },
                },
            ),
        },
    ),
)

_HPA_RULES = _strict(
    [],
    stabilizationWindowSeconds={"type": "integer", "minimum": 0, "maximum": 3600},
    selectPolicy={"enum": ["Max", "Min", "Disabled"]},
    policies={
        "type": "array",
        "items": _strict(
            ["type", "value", "periodSeconds"],
            type={"enum": ["Pods", "Percent"]},
            value={"type": "integer", "minimum": 1},
            periodSeconds={"type": "integer", "minimum": 1, "maximum": 1800},
        ),
    },
)
# KEDA's ScaledObject and TriggerAuthentication (keda.sh/v1alpha1); trigger metadata values
# are strings (KEDA rejects numbers there).
SCALED_OBJECT_SCHEMA = _crd(
    "keda.sh/v1alpha1",
    "ScaledObject",
    _strict(
        ["scaleTargetRef", "triggers"],
        scaleTargetRef=_strict(
            ["name"],
            apiVersion={"type": "string"},
            kind={"type": "string"},
            name={"type": "string", "minLength": 1},
        ),
        pollingInterval={"type": "integer", "minimum": 1},
        cooldownPeriod={"type": "integer", "minimum": 0},
        minReplicaCount={"type": "integer", "minimum": 0},
        maxReplicaCount={"type": "integer", "minimum": 1},
        advanced=_strict(
            [],
            restoreToOriginalReplicaCount={"type": "boolean"},
            horizontalPodAutoscalerConfig=_strict(
                [],
                name={"type": "string"},
                behavior=_strict([], scaleUp=_HPA_RULES, scaleDown=_HPA_RULES),
            ),
        ),
        triggers={
            "type": "array",
            "minItems": 1,
            "items": _strict(
                ["type", "metadata"],
                type={"type": "string"},
                name={"type": "string"},
                metricType={"enum": ["AverageValue", "Value", "Utilization"]},
                metadata=_STRINGS,
                authenticationRef=_strict(
                    ["name"],
                    name={"type": "string"},
                    kind={"enum": ["TriggerAuthentication", "ClusterTriggerAuthentication"]},
                ),
            ),
        },
    ),
)
TRIGGER_AUTHENTICATION_SCHEMA = _crd(
    "keda.sh/v1alpha1",
    "TriggerAuthentication",
    _strict(
        ["secretTargetRef"],
        secretTargetRef={
            "type": "array",
            "minItems": 1,
            "items": _strict(
                ["parameter", "name", "key"],
                parameter={"type": "string", "minLength": 1},
                name={"type": "string", "minLength": 1},
                key={"type": "string", "minLength": 1},
            ),
        },
    ),
)
CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": SERVICE_MONITOR_SCHEMA,
    "PrometheusRule": PROMETHEUS_RULE_SCHEMA,
    "ScaledObject": SCALED_OBJECT_SCHEMA,
    "TriggerAuthentication": TRIGGER_AUTHENTICATION_SCHEMA,
}


def manifest_problems(manifest: Manifest, kube_version: str) -> list[str]:
    """Strict schema errors of one manifest (unknown fields included); empty when valid."""
    label = f"{manifest.get('kind')}/{manifest.get('metadata', {}).get('name')}"
    schema = CRD_SCHEMAS.get(str(manifest.get("kind")))
    if schema is not None:
        validator = jsonschema.Draft202012Validator(schema)
        return [
            f"{label}: {'.'.join(map(str, e.path))}: {e.message}"
            for e in validator.iter_errors(manifest)
        ]
    try:
        kubernetes_validate.validate(manifest, kube_version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{label}: {'.'.join(map(str, error.path))}: {error.message}"]
    except (
        kubernetes_validate.SchemaNotFoundError,
        kubernetes_validate.InvalidSchemaError,
    ) as error:
        return [f"{label}: {error.message}"]
    return []


# ---- the checks ---------------------------------------------------------------


def checks() -> Iterator[tuple[str, Callable[[], list[str]]]]:
    yield "hadolint deploy/Dockerfile", lambda: hadolint_findings()
    yield "deploy/requirements.lock covers pyproject dependencies", lambda: lock_problems()
    yield "docker compose config deploy/compose.yaml", _compose_resolves
    yield (
        "the chart's alert rules and dashboard equal deploy/prometheus and deploy/grafana",
        (copy_problems),
    )
    value_sets: dict[str, dict[str, Any] | None] = {"default values": None, **ci_values()}
    for label, values in value_sets.items():
        yield f"helm lint --strict ({label})", lambda values=values: lint_chart(values)
        for version in KUBE_VERSIONS:
            yield (
                f"helm template ({label}) validates strictly against Kubernetes {version}",
                lambda values=values, version=version: _rendered_problems(values, version),
            )


def _compose_resolves() -> list[str]:
    try:
        compose_config()
    except ValueError as error:
        return str(error).splitlines()
    return []


def _rendered_problems(values: dict[str, Any] | None, version: str) -> list[str]:
    manifests = render_chart(values)
    if not manifests:
        return ["the chart rendered nothing"]
    return [p for m in manifests for p in manifest_problems(m, version)]


def main() -> int:
    failed = 0
    for label, check in checks():
        try:
            problems = check()
        except Exception as error:  # a tool that cannot run is a failed check, reported on its line
            problems = [f"{type(error).__name__}: {error}"]
        print(f"{'ok  ' if not problems else 'FAIL'} {label}", flush=True)
        for problem in problems:
            print(f"       {problem}")
        failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
