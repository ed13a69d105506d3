"""The chaos run's rollout phase: the previous release's services under load while the head
migrates the schema, then the head's services beside them, then the old ones stopped.

The previous release is a commit of this repository (`PREVIOUS_RELEASE`, the last release
before the current round of work; `--previous` names another), exported with `git
archive` into a directory of the run (`checkout`): the repository's own working tree is
never touched. Its services run on the same interpreter (the project's `.venv`, where the
head is installed in editable mode) with PYTHONPATH naming that tree's `shared/`,
`services/api/` and `services/worker/` first, so its `jobcore`, `jobqueue_api` and
`jobqueue_worker` are imported, not the head's; the job handlers (`tests.chaos.handlers`,
the application's code, not the product's) are the head's, so every execution is recorded
alike. Each is started as its tree's `pyproject.toml` declares its console script.

The phase (`run`), every step under the client's load:

1. the database is at the previous release's head, migrated by its own tree's `alembic
   upgrade head` (`Release.migrate`, from `System.start`); its API and workers serve
   alone for `ALONE` seconds;
2. the head's `jobqueue migrate` runs (as an operator, or a deployment's migration job,
   runs it: its own process) while they go on serving; it applies the head's revisions
   beyond the previous release's, except that it stops after 0008 while sessions of a
   release before 0008 are connected (their compatibility views stay; docs/upgrading.md);
3. the head's APIs and workers start beside the old ones; once all are ready the client
   sends to the old and the new APIs for `BESIDE` seconds;
4. the old APIs leave the client's rotation (as a load balancer takes a terminating
   instance out), then every old service gets SIGTERM and must exit 0;
5. `jobqueue migrate` runs again and reaches the head (0009 drops the views).

A readiness monitor polls every service that should be serving (`/readyz`, and for a worker
all its processes started) twice a second throughout. The record (`evidence.Rollout`) goes
to the checker: the migration must succeed and reach the head's revision, no service may
turn unready or exit other than 0, no API may answer 5xx (503 included) while the phase
goes on, and both releases must have done work in it (`tests.chaos.checker`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from alembic.script import ScriptDirectory

from tests.chaos.evidence import Rollout
from tests.chaos.load import Load
from tests.chaos.system import ROOT, Service, System, wait_until
from tests.pg import alembic_config

# The release deployed before this one: the last commit whose services expect 0010 (its
# dependencies are this tree's `dev` extra's). `--previous 65ec431` starts from 0009. A
# release before 0008 upgrades through the release at 0010 (docs/upgrading.md).
PREVIOUS_RELEASE = "402de7f"
ALONE = 8.0  # seconds the old services serve alone before the head migrates
AFTER_MIGRATION = 3.0  # seconds they serve the migrated schema alone
BESIDE = 8.0  # seconds both releases serve together
ROTATION_DRAIN = 1.0  # out of the client's rotation this long before SIGTERM
START_LIMIT = 120.0
STOP_LIMIT = 40.0
MIGRATION_LIMIT = 300.0
MONITOR_EVERY = 0.5
# About how long the phase takes (the new services' start is most of the rest): the
# client spreads its submissions over it and the fault phase.
ESTIMATE = 45.0
# Where each package of the product lives in a tree.
PACKAGE_DIRS = ("shared", "services/api", "services/worker")


@dataclass(frozen=True)
class Release:
    """A tree of an earlier commit of this repository, and how to run its code."""

    commit: str
    root: Path

    def pythonpath(self) -> str:
        """That tree's packages first, then the head's repository (for tests.chaos.handlers),
        then whatever the caller had."""
        paths = [str(self.root / d) for d in PACKAGE_DIRS]
        return os.pathsep.join(filter(None, [*paths, str(ROOT), os.environ.get("PYTHONPATH")]))

    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": self.pythonpath()}

    def argv(self, command: str) -> list[str]:
        """The console script `command` of that tree's pyproject.toml, on this interpreter."""
        with open(self.root / "pyproject.toml", "rb") as f:
            scripts = tomllib.load(f)["project"]["scripts"]
        module, _, function = scripts[command].partition(":")
        code = f"import sys; from {module} import {function}; sys.exit({function}())"
        return [sys.executable, "-c", code]

    def migrate(self, url: str) -> None:
        """`alembic upgrade head` from that tree, its own migrations and code."""
        code, output, _ = upgrade(self.root, url, self.env())
        if code != 0:
            raise RuntimeError(f"the previous release's migration exited {code}: {output}")


def checkout(commit: str, into: Path) -> Release:
    """Export `commit` of the repository into `into` (`git archive`: neither the working
    tree nor the repository's refs change)."""
    into.mkdir(parents=True)
    archive = subprocess.Popen(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit], stdout=subprocess.PIPE
    )
    assert archive.stdout is not None
    extract = subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=False)
    archive.stdout.close()
    if archive.wait() != 0 or extract.returncode != 0:
        raise RuntimeError(f"could not export commit {commit} of {ROOT}")
    return Release(commit, into)


def _migration(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str, float]:
    """`argv` in a process of its own: exit status, the end of its output, seconds."""
    started = time.monotonic()
    result = subprocess.run(
        argv,
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=MIGRATION_LIMIT,
        check=False,
    )
    output = (result.stdout + result.stderr).strip()
    return result.returncode, output[-2000:], time.monotonic() - started


def migrate_head(url: str) -> tuple[int, str, float]:
    """The head's `jobqueue migrate`, in a process of its own: exit status, output, seconds."""
    code = "import sys; from jobcore.client.cli import main; sys.exit(main(['migrate']))"
    return _migration([sys.executable, "-c", code], ROOT, {"DATABASE_URL": url})


def upgrade(root: Path, url: str, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    """`alembic upgrade head` of the tree at `root`, in a process of its own: exit status,
    output, seconds."""
    argv = [sys.executable, "-m", "alembic", "-c", str(root / "alembic.ini"), "upgrade", "head"]
    return _migration(argv, root, {**(env or {}), "DATABASE_URL": url})


def head_revision(url: str) -> str | None:
    """The head's newest revision, as its migrations declare it."""
    heads = ScriptDirectory.from_config(alembic_config(url)).get_heads()
    return heads[0] if len(heads) == 1 else ",".join(sorted(heads))


def revisions_between(url: str, older: str | None, newer: str | None) -> list[str]:
    """The head's revisions after `older` up to `newer`, oldest first."""
    if newer is None or older == newer:
        return []
    script = ScriptDirectory.from_config(alembic_config(url))
    found = [r.revision for r in script.iterate_revisions(newer, older or "base")]
    return [r for r in reversed(found) if r != older]


def current_revision(system: System) -> str | None:
    """The revision in jobqueue's schema, else (a release before 0008) in public."""
    for table in ("jobqueue.alembic_version", "public.alembic_version"):
        try:
            rows = system.query(f"SELECT version_num FROM {table}")
        except Exception:
            continue
        return str(rows[0][0]) if rows else None
    return None


class Monitor:
    """Polls the readiness of every service that should be serving, in a thread: a sample
    where one was not is recorded as (service name, time)."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.serving: set[str] = set()  # the names expected ready now
        self.unready: list[tuple[str, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rollout-monitor", daemon=True)

    def expect(self, services: list[Service], ready: bool) -> None:
        with self._lock:
            for s in services:
                (self.serving.add if ready else self.serving.discard)(s.name)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with httpx.Client(timeout=2.0) as http:
            while not self._stop.wait(MONITOR_EVERY):
                with self._lock:
                    names = set(self.serving)
                for service in [s for s in list(self.system.services) if s.name in names]:
                    ok = self.system.ready(service, http)
                    with self._lock:
                        if not ok and service.name in self.serving:
                            self.unready.append((service.name, time.time()))


def run(system: System, load: Load, log: Callable[[str], None] = print) -> Rollout:
    """The rollout phase; see the module docstring. Never raises for what it finds: the
    record says it, and the checker judges it."""
    release = system.previous
    assert release is not None, "the system was started without a previous release"
    url = system.cluster.url()
    old = list(system.services)
    old_apis = [s for s in old if not s.is_worker]
    problems: list[str] = []
    monitor = Monitor(system)
    monitor.expect(old, True)
    monitor.start()
    started_at = time.time()
    from_revision = current_revision(system)
    target = head_revision(url)
    log(f"rollout: {release.commit} at revision {from_revision} serving; head is {target}")
    new: list[Service] = []
    code: int | None = None
    output = ""
    migrated: tuple[float, float] | None = None
    to_revision = from_revision
    new_ready_at = None
    exits: list[tuple[str, int | None]] = []
    old_pids: set[int] = set()
    try:
        time.sleep(ALONE)  # the old release alone under load: part of the phase
        began = time.time()
        code, output, _ = migrate_head(url)
        migrated = (began, time.time())
        to_revision = current_revision(system)
        log(
            f"rollout: jobqueue migrate exited {code} after {migrated[1] - began:.2f}s, "
            f"revision {from_revision} -> {to_revision}"
        )
        if from_revision is not None and from_revision < "0008" and to_revision != "0008":
            problems.append(
                f"jobqueue migrate reached {to_revision} while the previous release served:"
                " it must stop after 0008, whose views that release works through"
            )
        time.sleep(AFTER_MIGRATION)  # the old release on the new schema, alone
        new = system.launch_staged()
        new_ready_at = wait_until(lambda: all(system.ready(s) for s in new), START_LIMIT)
        if new_ready_at is None:
            problems.append(f"the head's services were not ready within {START_LIMIT:g}s")
        monitor.expect(new, True)
        load.use_apis([s.url("") for s in [*old_apis, *new] if not s.is_worker])
        log(f"rollout: the head's services ready; both releases serving for {BESIDE:g}s")
        time.sleep(BESIDE)  # both releases under load: part of the phase
        load.use_apis([s.url("") for s in new if not s.is_worker])
        time.sleep(ROTATION_DRAIN)  # out of the rotation before the SIGTERM, as behind an LB
        for service in old:
            if service.is_worker:
                service.current.working_children()  # read its log: every child it started
                old_pids |= service.current.started_children
        monitor.expect(old, False)
        stopped_at = time.time()
        for service in old:
            service.current.signal(signal.SIGTERM)
        for service in old:
            status = service.current.wait(STOP_LIMIT)
            if status is None:
                service.current.kill_group()
            exits.append((service.name, status))
            system.retire(service)
        log(f"rollout: the previous release stopped ({_exits(exits)})")
        if to_revision != target:  # the deferred rest, now that the old sessions are gone
            again, more, _ = migrate_head(url)
            code = again if code == 0 else code
            output = f"{output}\n{more}"
            to_revision = current_revision(system)
            log(f"rollout: jobqueue migrate again exited {again}, revision {to_revision}")
    except Exception as exc:  # the record says it, the checker fails the run
        problems.append(f"the rollout failed: {type(exc).__name__}: {exc}")
        stopped_at = time.time()
    finally:
        monitor.stop()
    return Rollout(
        previous=release.commit,
        started_at=started_at,
        ended_at=time.time(),
        from_revision=from_revision,
        target_revision=target,
        to_revision=to_revision,
        revisions_applied=tuple(revisions_between(url, from_revision, to_revision)),
        migration_exit=code,
        migration_output=output,
        migration_started_at=migrated[0] if migrated else None,
        migration_ended_at=migrated[1] if migrated else None,
        old_services=tuple(s.name for s in old),
        old_apis=tuple(s.url("") for s in old_apis),
        new_apis=tuple(s.url("") for s in new if not s.is_worker),
        old_worker_pids=tuple(sorted(old_pids)),
        new_ready_at=new_ready_at,
        old_stopped_at=stopped_at,
        old_exits=tuple(exits),
        unready=tuple(monitor.unready),
        problems=tuple(problems),
    )


def _exits(exits: list[tuple[str, int | None]]) -> str:
    return ", ".join(f"{name} exit {code}" for name, code in exits)


def cleanup(release: Release | None) -> None:
    if release is not None:
        with contextlib.suppress(OSError):
            shutil.rmtree(release.root)
