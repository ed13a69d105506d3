"""Where a worker process spends its time during a drain: py-spy samples, grouped by area.

`--profile` runs one extra, unmeasured drain of our queue with `py-spy record`
attached to every worker child, then sorts each sample into the first area its
stack touches (logging before JSON, SQLAlchemy before asyncpg, ...), and lists
the functions with the most samples of their own.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from bench.procs import BIN

RATE = 200  # samples per second

# (area, substring of a frame that puts a sample there), in order of precedence.
AREAS = [
    ("logging (job started/finished lines)", ("logging/__init__.py", "jobcore/logs.py")),
    ("metrics", ("prometheus_client/",)),
    ("SQLAlchemy", ("sqlalchemy/",)),
    ("asyncpg", ("asyncpg/",)),
    ("handler", ("bench/adapters/ours_jobs.py", "bench/beacon.py")),
    ("JSON", ("json/",)),
]
IDLE = "select (selectors.py"


def available() -> bool:
    return (BIN / "py-spy").exists() or shutil.which("py-spy") is not None


def worker_children(supervisor: int) -> list[int]:
    """The supervisor's job-running processes: the children of its fork server (a worker of
    an earlier commit: its spawned children), not the fork server itself nor
    multiprocessing's resource tracker."""
    pids = []
    for pid in children(supervisor):
        cmdline = _cmdline(pid)
        if b"spawn_main" in cmdline:
            pids.append(pid)
        elif b"multiprocessing.forkserver" in cmdline:
            pids.extend(children(pid))
    return pids


def children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def start(pids: list[int], workdir: Path) -> list[tuple[subprocess.Popen[bytes], Path]]:
    spy = str(BIN / "py-spy") if (BIN / "py-spy").exists() else "py-spy"
    spies = []
    for pid in pids:
        out = workdir / f"profile-{pid}.txt"
        argv = [spy, "record", "-p", str(pid), "-r", str(RATE), "-f", "raw", "-o", str(out)]
        spies.append(
            (subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out)
        )
    return spies


async def stop(spies: list[tuple[subprocess.Popen[bytes], Path]]) -> dict[str, Any]:
    for proc, _ in spies:
        proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
    for proc, _ in spies:
        try:
            await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return summarize([out for _, out in spies if out.exists()])


def summarize(paths: list[Path]) -> dict[str, Any]:
    areas: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            total += n
            frames = stack.split(";")
            own[frames[-1].strip()] += n
            areas[_area(frames)] += n
    if not total:
        return {}
    return {
        "samples": total,
        "areas_pct": {k: round(v / total * 100, 1) for k, v in areas.most_common()},
        "top_self_pct": {k: round(v / total * 100, 1) for k, v in own.most_common(12)},
    }


def _area(frames: list[str]) -> str:
    if IDLE in frames[-1]:
        return "idle (waiting on sockets)"
    for area, needles in AREAS:
        if any(needle in frame for frame in frames for needle in needles):
            return area
    if "asyncio/" in frames[-1]:
        return "asyncio event loop"
    return "worker code and other"
