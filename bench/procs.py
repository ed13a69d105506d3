"""Benchmark processes: each in its own process group, output to a log file, always stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin"

# Every process group started, for the report (a check that none outlived the run).
STARTED: list[int] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session (so its whole tree can be signalled) with `env` added."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            env=full_env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    STARTED.append(proc.pid)
    return proc


def stop(procs: list[subprocess.Popen[bytes]], timeout: float = 30.0) -> None:
    """SIGTERM every process group, wait, then SIGKILL whatever is left."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, deadline - time.monotonic()))
    for proc in procs:
        # Children of a process that exited may still be alive in its group (multiprocessing's
        # resource tracker outlives the supervisor by a moment).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        _wait_group_gone(proc.pid, 10.0)


def _wait_group_gone(pgid: int, limit: float) -> None:
    """Until no process, not even an unreaped one, is left in the group."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
