"""The queue gauges in prometheus-client's multiprocess mode, as the supervisor's /metrics
merges them: only the values the leading process sets now, none of a process that stopped
leading or exited, none of a queue that is gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from prometheus_client import multiprocess

from jobcore.search import QueueDepth

# A worker process's side of the gauges, driven over stdin: a JSON list of depths to show,
# or null to hide them all; it answers "ok" once the metric file is written.
_CHILD = """
import json, sys
from jobcore.search import QueueDepth
from jobqueue_worker import metrics
for line in sys.stdin:
    depths = json.loads(line)
    if depths is None:
        metrics.hide_queue_depths()
    else:
        metrics.show_queue_depths([QueueDepth(*d) for d in depths])
    print("ok", flush=True)
"""


class Child:
    def __init__(self, metrics_dir: Path) -> None:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def send(self, depths: list[QueueDepth] | None) -> None:
        assert self.proc.stdin and self.proc.stdout
        rows = None if depths is None else [list(d.__dict__.values()) for d in depths]
        self.proc.stdin.write(json.dumps(rows) + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def exit(self) -> int:
        assert self.proc.stdin
        self.proc.stdin.close()
        return self.proc.wait(30)


def merged(metrics_dir: Path) -> dict[tuple[Any, ...], float]:
    """The queue gauges as the supervisor's /metrics shows them."""
    collector = multiprocess.MultiProcessCollector(None, path=str(metrics_dir))  # type: ignore[no-untyped-call]
    found = {}
    for family in collector.collect():
        for s in family.samples:
            if s.name in ("jobs_queued", "jobs_oldest_pending_age_seconds"):
                found[(s.name, *(s.labels[k] for k in sorted(s.labels)))] = s.value
    return found


def _series(depth: QueueDepth) -> dict[tuple[Any, ...], float]:
    q = depth.queue
    return {
        ("jobs_queued", q, "pending"): depth.pending,
        ("jobs_queued", q, "scheduled"): depth.scheduled,
        ("jobs_queued", q, "processing"): depth.processing,
        ("jobs_queued", q, "dead_letter"): depth.dead_letter,
        ("jobs_oldest_pending_age_seconds", q): depth.oldest_pending_age_seconds,
    }


def test_only_the_current_leaders_values_of_existing_queues_are_exported(tmp_path):
    alpha, beta = QueueDepth("alpha", 3, 2, 1, 0, 12.5), QueueDepth("beta", 7, 0, 0, 4, 1.0)
    first, second = Child(tmp_path), Child(tmp_path)
    try:
        first.send([alpha, beta])
        assert merged(tmp_path) == {**_series(alpha), **_series(beta)}

        # beta is gone: it is no longer reported, not even as 0.
        alpha = QueueDepth("alpha", 0, 2, 1, 0, 0.0)
        first.send([alpha])
        assert merged(tmp_path) == _series(alpha)

        # The lead moves to the second process: the first hides what it exported.
        first.send(None)
        assert merged(tmp_path) == {}
        gamma = QueueDepth("gamma", 1, 1, 1, 1, 3.0)
        second.send([gamma])
        assert merged(tmp_path) == _series(gamma)

        # And back, over a queue both exported: the latest values win.
        second.send(None)
        alpha = QueueDepth("alpha", 9, 9, 9, 9, 9.0)
        first.send([alpha])
        assert merged(tmp_path) == _series(alpha)
    finally:
        pid = first.proc.pid
        assert first.exit() == 0 and second.exit() == 0
    # A leader that exits (the supervisor marks it dead) leaves no values behind.
    multiprocess.mark_process_dead(pid, str(tmp_path))  # type: ignore[no-untyped-call]
    assert merged(tmp_path) == {}
