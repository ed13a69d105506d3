"""How long the services take to start: from exec to `/readyz` 200, and where the time goes.

    python -m bench.startup [--repeat R]

For each service (`jobqueue-api`; `jobqueue-worker` with WORKER_PROCESSES=2), on a
migrated throwaway database, `repeat` times: the time from exec to the first `/readyz`
200 (polled every 10 ms), and, in separate interpreters, what that time is made of: the
interpreter's own start (`python -c pass`) and the import of the service's entry module
(timed inside a fresh interpreter). What is left is the service's own start-up: settings,
the schema check, binding, and for the worker spawning its processes (each imports the
worker again) and their first database round trips. Medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import pg
from bench.adapters.ours import Ours
from bench.http import get_status
from bench.procs import BIN, ROOT, free_port
from bench.stats import median

SERVICES = {
    "jobqueue-api": ("jobqueue_api.main", "HTTP_ADDR", {}),
    "jobqueue-worker": ("jobqueue_worker.main", "METRICS_ADDR", {"WORKER_PROCESSES": "2"}),
}


def _seconds(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def _import_seconds(python: str, module: str, env: dict[str, str]) -> float:
    """The import of `module` alone, timed inside a fresh interpreter."""
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    done = subprocess.run([python, "-c", code], env=env, check=True, capture_output=True, text=True)
    return float(done.stdout)


async def _until_ready(command: str, env: dict[str, str], port: int) -> float:
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        str(BIN / command),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        while await get_status("127.0.0.1", port, "/readyz") != 200:
            if proc.returncode is not None:
                raise RuntimeError(f"{command} exited with {proc.returncode} at start-up")
            if time.perf_counter() - started > 60:
                raise TimeoutError(f"{command} was not ready after 60 s")
            await asyncio.sleep(0.01)
        return time.perf_counter() - started
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


async def run(repeat: int) -> dict[str, Any]:
    server = pg.server_url()
    with tempfile.TemporaryDirectory(prefix="jq-bench-startup-") as tmp:
        ours = Ours(server, Path(tmp), 1)
        await ours.prepare()
        try:
            base = {**os.environ, "PYTHONPATH": str(ROOT), **ours.env()}
            python = str(BIN / "python")
            figures: dict[str, Any] = {}
            for command, (module, address, extra) in SERVICES.items():
                ready, interpreter, imports = [], [], []
                for _ in range(repeat):
                    port = free_port()
                    env = {**base, address: f"127.0.0.1:{port}", **extra}
                    ready.append(await _until_ready(command, env, port))
                    interpreter.append(_seconds([python, "-c", "pass"], base))
                    imports.append(_import_seconds(python, module, base))
                figures[command] = {
                    "ready_s": median(ready),
                    "interpreter_s": median(interpreter),
                    "import_s": median(imports),
                    "rest_s": median(ready) - median(interpreter) - median(imports),
                    "ready_runs_s": ready,
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
    out = ROOT / "bench-results" / "startup.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    ok = all(f["ready_s"] <= 2.0 for f in result["services"].values())
    print(f"[{'met' if ok else 'MISSED'}] each service ready within 2 s of exec")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
