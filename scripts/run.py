"""`make run`: find a database, migrate it, run jobqueue-api and jobqueue-worker until Ctrl-C.

The database comes from `scripts/devdb.py url` ($DATABASE_URL, else the local
server, else an embedded one under .devdb/). Every other setting passes through
from the environment to both services.

The services run in sessions of their own so that Ctrl-C in the terminal reaches
only this script, which forwards it once to each: a signal delivered twice would
make them skip their graceful shutdown. A second Ctrl-C here kills both at once.
If one service exits on its own, the other is stopped and its status is ours. If
this script is killed outright, Linux sends both services SIGTERM.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from jobcore import environ, logs
from jobcore.settings import parse_addr

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SERVICES = ("jobqueue-api", "jobqueue-worker")
INTERRUPTED = 130  # the shell's status for a run cut short by Ctrl-C
PR_SET_PDEATHSIG = 1

log = logging.getLogger("jobqueue.run")


def main() -> int:
    logs.configure("info")
    received: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: received.append(signum))

    url = _step("database", [sys.executable, str(ROOT / "scripts" / "devdb.py"), "url"], None)
    if url is None or received:
        return INTERRUPTED if received else 1
    env = {**os.environ, "DATABASE_URL": url}
    if _step("migrations", [str(BIN / "jobqueue"), "migrate"], env) is None or received:
        return INTERRUPTED if received else 1
    log.info("database ready", extra={"database_url": _redact(url)})
    return supervise(env, received)


def _step(name: str, command: list[str], env: dict[str, str] | None) -> str | None:
    """Run a setup command, logging its output as JSON lines; its last line, or None on failure."""
    result = subprocess.run(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0:
        for line in lines:
            log.error(line, extra={"step": name})
        log.error(f"{name} failed with status {result.returncode}", extra={"step": name})
        return None
    # The database step's last line is the URL, which may hold a password: logged redacted.
    for line in lines[:-1] if name == "database" else lines:
        log.info(line, extra={"step": name})
    return lines[-1] if lines else ""


def supervise(env: dict[str, str], received: list[int]) -> int:
    """Run both services until a signal or until one of them exits; returns our exit status."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for name in SERVICES:
        procs[name] = subprocess.Popen(
            [str(BIN / name)],
            cwd=ROOT,
            env=env,
            start_new_session=True,
            preexec_fn=_stop_with_parent(os.getpid()),
        )
        log.info(f"{name} started", extra={"service": name, "pid": procs[name].pid})

    status: int | None = None  # set when a service exits on its own
    stopping = False
    handled = 0
    probe = _Probe(env)
    while [proc.poll() for proc in procs.values()].count(None):  # polls every one
        while handled < len(received):
            signum = received[handled]
            handled += 1
            if not stopping:
                stopping = True
                log.info(f"{signal.Signals(signum).name}: stopping; Ctrl-C again kills at once")
                _signal_all(procs, signum)
            else:
                log.warning("second signal: killing both services")
                for proc in procs.values():
                    with suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                status = INTERRUPTED
        if not stopping:
            for name, proc in procs.items():
                if proc.returncode is not None:
                    status = _exit_status(proc.returncode)
                    stopping = True
                    log.error(f"{name} exited with status {status}; stopping the other service")
                    _signal_all(procs, signal.SIGTERM)
                    break
            else:
                probe.check()
        time.sleep(0.1)

    codes = {name: _exit_status(proc.wait()) for name, proc in procs.items()}
    if status is None:
        status = next((code for code in codes.values() if code != 0), 0)
    log.info("stopped", extra={"status": status, **{f"{n}_status": c for n, c in codes.items()}})
    return status


def _stop_with_parent(parent: int) -> Callable[[], None] | None:
    """In the child: ask Linux for SIGTERM when this script dies, even by SIGKILL.

    The services sit in sessions of their own, so nothing else would stop them.
    """
    if not sys.platform.startswith("linux"):
        return None

    def arrange() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return arrange


def _signal_all(procs: dict[str, subprocess.Popen[bytes]], signum: int) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            with suppress(ProcessLookupError):
                proc.send_signal(signum)


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _redact(url: str) -> str:
    """The URL without its password, for the log."""
    head, sep, rest = url.partition("://")
    userinfo, at, hostpart = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{head}{sep}{userinfo.split(':', 1)[0]}:***@{hostpart}"


class _Probe:
    """Polls both services' /readyz and logs once where to reach them."""

    def __init__(self, env: dict[str, str]) -> None:
        # The worker first: while it is not ready, the API's access log stays quiet.
        self.urls = {
            "metrics": _local_url(environ.getenv("METRICS_ADDR", ":9090", env) or ""),
            "api": _local_url(environ.getenv("HTTP_ADDR", ":8080", env) or ""),
        }
        # No proxy from the environment: these are loopback requests.
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.done = any(url is None for url in self.urls.values())
        self.next = 0.0

    def check(self) -> None:
        if self.done or time.monotonic() < self.next:
            return
        self.next = time.monotonic() + 0.5
        for url in self.urls.values():
            try:
                with self.opener.open(f"{url}/readyz", timeout=0.5) as response:
                    if response.status != 200:
                        return
            except OSError:
                return
        self.done = True
        api, metrics = self.urls["api"], self.urls["metrics"]
        log.info(
            f"jobqueue is ready: API {api}, worker metrics {metrics}/metrics; Ctrl-C stops both",
            extra={"api": api, "metrics": metrics},
        )


def _local_url(addr: str) -> str | None:
    """Where to reach a listen address from this machine; None if it is malformed."""
    try:
        host, port = parse_addr(addr)
    except ValueError:
        return None  # the service names the variable and exits
    if host in ("0.0.0.0", ""):
        host = "localhost"
    elif host == "::":
        host = "[::1]"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


if __name__ == "__main__":
    sys.exit(main())
