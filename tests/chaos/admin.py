"""The chaos run's operator: queue pauses through the APIs, beside the faults, each
recorded with its times for the checker.

While the faults go on (`Operator.start` at the fault phase's start), in a thread of its
own: PAUSES pauses of PAUSED_QUEUE (one the load submits to), each held PAUSE_SECONDS and
then resumed. Like the load's own requests, one without an answer, or a 503, is sent
again to the other API until a 200 comes back; any other answer is a failure of the run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import httpx

from tests.chaos.evidence import QueuePause

PAUSED_QUEUE = "bulk"
PAUSES = 3
PAUSE_SECONDS = 3.0
# When each step comes, as a share of the fault phase.
PAUSE_AT = (0.1, 0.4, 0.7)
GIVE_UP = 60.0


class Operator:
    """Pauses over `duration` seconds from `start()`. `apis()`: the APIs to ask now (the
    load's rotation)."""

    def __init__(
        self,
        apis: Callable[[], Sequence[str]],
        duration: float,
        log: Callable[[str], None] = print,
    ) -> None:
        self.apis = apis
        self.duration = duration
        self.log = log
        self.pauses: list[QueuePause] = []
        self.failures: list[str] = []
        self._http = httpx.Client(timeout=5.0)
        self._serial = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="operator", daemon=True)

    def start(self) -> None:
        self._began = time.time()
        self._thread.start()

    def finish(self) -> None:
        """Wait for the schedule."""
        self._thread.join(max(0.0, self._began + self.duration - time.time()) + 3 * GIVE_UP)
        if self._thread.is_alive():
            self.failures.append("operator: its schedule did not finish")
            self._stop.set()

    def close(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(GIVE_UP)
        self._http.close()

    def _run(self) -> None:
        try:
            for at in PAUSE_AT[:PAUSES]:
                if self._stop.wait(max(0.0, self._began + at * self.duration - time.time())):
                    return
                self._pause()
        except Exception as exc:  # recorded: the run must fail, not hang
            self.failures.append(f"operator: {exc!r}")

    def _pause(self) -> None:
        sent, answered = self._ask(f"/queues/{PAUSED_QUEUE}/pause")
        if answered is not None:
            self._stop.wait(PAUSE_SECONDS)
        # Resumed even if the pause was never answered: it may have applied.
        resume_sent, resumed = self._ask(f"/queues/{PAUSED_QUEUE}/resume")
        if answered is not None:
            self.pauses.append(QueuePause(PAUSED_QUEUE, sent, answered, resume_sent, resumed))
            self.log(f"operator: {PAUSED_QUEUE} paused {resume_sent - answered:.1f}s")

    def _ask(self, path: str) -> tuple[float, float | None]:
        """POST until a 200: when the first request was sent, when the 200 came (None:
        never)."""
        self._serial += 1
        first = time.time()
        give_up = time.monotonic() + GIVE_UP
        attempt = 0
        while time.monotonic() < give_up:
            urls = list(self.apis())
            url = urls[(self._serial + attempt) % len(urls)]
            attempt += 1
            try:
                response = self._http.post(f"{url}{path}")
            except httpx.HTTPError:
                time.sleep(0.2)
                continue
            answered = time.time()
            if response.status_code == 200:
                return first, answered
            if response.status_code != 503:
                self.failures.append(
                    f"POST {path} answered {response.status_code}: {response.text[:200]}"
                )
                return first, None
            time.sleep(0.2)
        self.failures.append(f"POST {path}: no 200 within {GIVE_UP:g}s")
        return first, None
