"""How long the services take to start: from exec to `/readyz` 200, and where the time goes.

    python -m bench.startup [--repeat R]

For each service (`jobqueue-api`; `jobqueue-worker` with WORKER_PROCESSES=2), on a
migrated throwaway database, `repeat` times: the time from exec to the first `/readyz`
200 (polled every 10 ms) and to each of the service's start-up log lines (when the line
reached the benchmark), and, in separate interpreters, what that time is made of: the
interpreter's own start (`python -c pass`) and the import of the modules the service's
main process loads before it serves (timed inside a fresh interpreter). For the worker
also the import of what its fork server loads (`jobqueue_worker.preload`), which runs
in parallel with the supervisor's own. What is left is the service's own start-up:
settings, the schema check, binding, and for the worker forking its processes and their
first database round trips. Medians.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import pg
from bench.adapters.ours import Ours
from bench.http import get_status
from bench.procs import BIN, ROOT, free_port
from bench.stats import median

PROCESSES = 2


@dataclass(frozen=True)
class Service:
    address: str
    env: dict[str, str]
    # What the main process imports before it serves (jobqueue_worker.main imports most
    # of its modules inside its functions, so naming the entry module would miss them).
    imports: tuple[str, ...]
    # Imported elsewhere, in parallel with `imports`: the worker's fork server.
    parallel_imports: tuple[str, ...]
    # Log lines whose arrival is timed: the first of each, and the PROCESSES-th of `each`.
    milestones: tuple[str, ...]
    each: str | None = None


SERVICES = {
    "jobqueue-api": Service("HTTP_ADDR", {}, ("jobqueue_api.main",), (), ("starting",)),
    "jobqueue-worker": Service(
        "METRICS_ADDR",
        {"WORKER_PROCESSES": str(PROCESSES)},
        (
            "jobqueue_worker.main",
            "jobcore.settings",
            "jobcore.registry",
            "jobqueue_worker.server",
            "jobqueue_worker.supervisor",
        ),
        ("jobqueue_worker.preload",),
        ("worker starting", "worker started", "worker process started"),
        each="listening for wake-ups",
    ),
}


def _seconds(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def _import_seconds(python: str, modules: tuple[str, ...], env: dict[str, str]) -> float:
    """The import of `modules` alone, timed inside a fresh interpreter."""
    code = (
        f"import time; t = time.perf_counter(); import {', '.join(modules)};"
        " print(time.perf_counter() - t)"
    )
    done = subprocess.run([python, "-c", code], env=env, check=True, capture_output=True, text=True)
    return float(done.stdout)


async def _until_ready(
    command: str, service: Service, env: dict[str, str], port: int
) -> tuple[float, dict[str, float]]:
    """Seconds from exec to /readyz 200, and to each milestone seen by then."""
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        str(BIN / command),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    seen: dict[str, float] = {}
    all_up = asyncio.Event()
    reading = asyncio.create_task(_milestones(proc, service, started, seen, all_up))
    try:
        while await get_status("127.0.0.1", port, "/readyz") != 200:
            if proc.returncode is not None:
                raise RuntimeError(f"{command} exited with {proc.returncode} at start-up")
            if time.perf_counter() - started > 60:
                raise TimeoutError(f"{command} was not ready after 60 s")
            await asyncio.sleep(0.01)
        ready = time.perf_counter() - started
        if service.each:
            # Every process up and connected: may come just after /readyz (one is enough).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await all_up.wait()
        return ready, dict(seen)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
        await reading


async def _milestones(
    proc: asyncio.subprocess.Process,
    service: Service,
    started: float,
    seen: dict[str, float],
    all_up: asyncio.Event,
) -> None:
    assert proc.stdout is not None
    counted = 0
    async for raw in proc.stdout:
        try:
            msg = json.loads(raw).get("msg")
        except ValueError:
            continue
        at = time.perf_counter() - started
        if msg in service.milestones:
            seen.setdefault(msg, at)
        if msg == service.each:
            counted += 1
            if counted == PROCESSES:
                seen.setdefault(f"all: {msg}", at)
                all_up.set()


async def run(repeat: int) -> dict[str, Any]:
    server = pg.server_url()
    with tempfile.TemporaryDirectory(prefix="jq-bench-startup-") as tmp:
        ours = Ours(server, Path(tmp), 1)
        await ours.prepare()
        try:
            base = {**os.environ, "PYTHONPATH": str(ROOT), **ours.env()}
            python = str(BIN / "python")
            figures: dict[str, Any] = {}
            for command, service in SERVICES.items():
                ready, interpreter, imports, parallel = [], [], [], []
                milestones: dict[str, list[float]] = {}
                for _ in range(repeat):
                    port = free_port()
                    env = {**base, service.address: f"127.0.0.1:{port}", **service.env}
                    took, seen = await _until_ready(command, service, env, port)
                    ready.append(took)
                    for msg, at in seen.items():
                        milestones.setdefault(msg, []).append(at)
                    interpreter.append(_seconds([python, "-c", "pass"], base))
                    imports.append(_import_seconds(python, service.imports, base))
                    if service.parallel_imports:
                        parallel.append(_import_seconds(python, service.parallel_imports, base))
                figures[command] = {
                    "ready_s": median(ready),
                    "interpreter_s": median(interpreter),
                    "import_s": median(imports),
                    "rest_s": median(ready) - median(interpreter) - median(imports),
                    "ready_runs_s": ready,
                    "milestones_s": {msg: median(at) for msg, at in milestones.items()},
                    **({"parallel_import_s": median(parallel)} if parallel else {}),
                }
        finally:
            await ours.cleanup()
    return {"repeat": repeat, "load_average": os.getloadavg(), "services": figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    result = asyncio.run(run(parser.parse_args().repeat))
    print("Start-up: exec to /readyz 200 (medians)")
    for command, f in result["services"].items():
        print(
            f"  {command:<16} {f['ready_s']:.2f} s: interpreter {f['interpreter_s']:.2f} s,"
            f" imports {f['import_s']:.2f} s, the rest {f['rest_s']:.2f} s"
            f" (runs {', '.join(f'{s:.2f}' for s in f['ready_runs_s'])})"
        )
        if "parallel_import_s" in f:
            parallel = f["parallel_import_s"]
            print(f"  {'':<16} in parallel: the fork server's imports {parallel:.2f} s")
        for msg, at in f["milestones_s"].items():
            print(f"  {'':<16} {at:.2f} s  {msg!r}")
    out = ROOT / "bench-results" / "startup.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    ok = all(f["ready_s"] <= 2.0 for f in result["services"].values())
    print(f"[{'met' if ok else 'MISSED'}] each service ready within 2 s of exec")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
