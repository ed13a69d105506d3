"""Submits through the API while a failover happens: threads posting `test.fenced` jobs
one after another, each answer kept with when it came, and the jobs' states read from the
database itself."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

import httpx

from tests.chaos.cluster import Cluster

# Most jobs short, some running through the fault.
DURATIONS = (0.0, 0.2, 0.0, 1.0)


@dataclass(frozen=True)
class Answer:
    at: float  # time.monotonic() when the answer came
    status: int | None  # None: no answer (a transport error)
    job_id: str | None


class Traffic:
    """`threads` submitters against `base` (the API's address), each pausing `pause`
    seconds between submits, until `stop()`."""

    def __init__(self, base: str, threads: int = 2, pause: float = 0.1) -> None:
        self.base = base
        self.pause = pause
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._submit, daemon=True) for _ in range(threads)]

    def start(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _submit(self) -> None:
        with httpx.Client(base_url=self.base, timeout=10) as client:
            for seconds in itertools.cycle(DURATIONS):
                if self._stop.is_set():
                    return
                body = {"type": "test.fenced", "payload": {"seconds": seconds}}
                try:
                    response = client.post("/jobs", json=body)
                    job_id = response.json()["id"] if response.status_code == 201 else None
                    answer = Answer(time.monotonic(), response.status_code, job_id)
                except httpx.HTTPError:
                    answer = Answer(time.monotonic(), None, None)
                with self._lock:
                    self.answers.append(answer)
                self._stop.wait(self.pause)

    def acknowledged(self, after: float = 0.0) -> list[str]:
        """Ids of the jobs whose submit answered 201 after `after` (monotonic)."""
        with self._lock:
            return [a.job_id for a in self.answers if a.status == 201 and a.at > after and a.job_id]

    def statuses(self) -> dict[int | None, int]:
        with self._lock:
            counts: dict[int | None, int] = {}
            for answer in self.answers:
                counts[answer.status] = counts.get(answer.status, 0) + 1
            return counts


def states(cluster: Cluster, ids: list[str]) -> dict[str, str]:
    """The status of each of `ids` found on `cluster` (an id not there is left out)."""
    with cluster.connect() as conn:
        rows = conn.execute(
            "SELECT id::text, status FROM jobqueue.jobs WHERE id = ANY(%s::uuid[])", (ids,)
        ).fetchall()
    return {job_id: status for job_id, status in rows}


def all_completed(cluster: Cluster, ids: list[str]) -> bool:
    found = states(cluster, ids)
    return len(found) == len(set(ids)) and set(found.values()) <= {"completed"}
