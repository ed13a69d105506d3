"""API_PROCESSES: one listening socket served by that many `jobqueue-api` processes, so one
container uses every core (docs/configuration.md).

The supervisor binds HTTP_ADDR once and starts the processes with the socket inherited;
each is a whole API (its own pool, its waiters' listening connection, its metrics) that
shares nothing with the others but the socket and the database, and the kernel hands each
new connection to one of them. SIGTERM and SIGINT are passed on to every process (a second
one too, which cuts their shutdown short); the supervisor exits once all have stopped, with
the worst status. A process that exits on its own (a crash, the database unreachable at
startup) stops the others and the supervisor with it, as one process would: the
orchestrator restarts the whole.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from jobcore import environ
from jobcore.settings import Address, ApiSettings
from jobqueue_api import metrics

log = logging.getLogger("jobqueue.api")

# Set for the processes the supervisor starts: the inherited listening socket's descriptor.
LISTEN_FD = "JOBQUEUE_API_LISTEN_FD"
# How often the supervisor looks at its processes.
_POLL = 0.2
_BACKLOG = 2048
_PR_SET_PDEATHSIG = 1


def listen(http_addr: Address) -> socket.socket:
    host, port = http_addr
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=_BACKLOG)
    sock.set_inheritable(True)
    return sock


def supervise(settings: ApiSettings) -> int:
    """Serve HTTP_ADDR with API_PROCESSES processes until they stop; the exit status."""
    try:
        sock = listen(settings.http_addr)
    except OSError as exc:
        variable = environ.variable("HTTP_ADDR")
        log.error(f"cannot listen on {settings.http_addr} ({variable}): {exc}")
        return 1
    fd = sock.fileno()
    # prometheus-client's multiprocess mode (docs/operations.md): every process writes its
    # values to this directory, and /metrics sums them. An operator's directory is emptied.
    metrics_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(
        prefix="jobqueue-api-metrics-"
    )
    for stale in Path(metrics_dir).glob("*.db"):
        stale.unlink()
    env = {
        **os.environ,
        LISTEN_FD: str(fd),
        "PROMETHEUS_MULTIPROC_DIR": metrics_dir,
        metrics.MULTIPROCESS: "1",
    }

    def start() -> subprocess.Popen[bytes]:
        # A session of its own: a terminal's Ctrl-C reaches the supervisor alone, which
        # passes it on once (a second signal would cut the processes' shutdown short).
        return subprocess.Popen(
            [sys.executable, "-m", "jobqueue_api.main"],
            env=env,
            pass_fds=(fd,),
            start_new_session=True,
            preexec_fn=_stop_with_parent,  # safe: the supervisor runs no threads
        )

    processes = [start() for _ in range(settings.api_processes)]
    # The processes hold the socket now. Keeping a copy here would let the kernel queue
    # connections that nobody accepts any more once they have closed theirs.
    sock.close()
    log.info(
        "API processes started",
        extra={"http_addr": str(settings.http_addr), "pids": [p.pid for p in processes]},
    )
    stopping = False

    def pass_on(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for process in processes:
            if process.poll() is None:
                process.send_signal(signum)

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    while True:
        codes = [_status(process.poll()) for process in processes]
        if all(code is not None for code in codes):
            if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
                shutil.rmtree(metrics_dir, ignore_errors=True)
            log.info("API processes stopped", extra={"exit_statuses": codes})
            return max(code or 0 for code in codes)
        ended = [
            (p.pid, code) for p, code in zip(processes, codes, strict=True) if code is not None
        ]
        if not stopping and ended:
            pid, code = ended[0]
            log.error(
                "an API process exited: stopping the others",
                extra={"pid": pid, "exit_status": code},
            )
            pass_on(signal.SIGTERM, None)
        time.sleep(_POLL)


def _stop_with_parent() -> None:
    """In a started process: SIGTERM when the supervisor dies, however it dies (Linux)."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _status(returncode: int | None) -> int | None:
    """An exit status as a shell shows it: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode is not None and returncode < 0 else returncode
