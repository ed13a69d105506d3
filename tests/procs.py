"""Start and stop the real console scripts in tests; read their JSON log lines."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BIN = Path(__file__).resolve().parent.parent / ".venv" / "bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class Service:
    """A running console script (`jobqueue-api`, `jobqueue-worker`) with its output captured."""

    def __init__(self, command: str, env: dict[str, str], args: list[str] | None = None) -> None:
        full_env = {**os.environ, **env}
        self.command = command
        self.proc = subprocess.Popen(
            [str(BIN / command), *(args or [])],
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def logs(self) -> list[dict[str, Any]]:
        """Every stdout line parsed as JSON (a non-JSON line fails the test)."""
        return [json.loads(line) for line in list(self.lines) if line.strip()]

    def output(self) -> str:
        return "\n".join(self.lines)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, then wait; SIGKILL the whole process group if it does not exit in time."""
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
