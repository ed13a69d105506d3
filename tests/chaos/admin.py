"""The chaos run's operator: queue pauses and bulk actions through the APIs, beside the
faults, each recorded with its times and answer for the checker.

While the faults go on (`Operator.start` at the fault phase's start), in a thread of its
own: PAUSES pauses of PAUSED_QUEUE (one the load submits to), each held PAUSE_SECONDS and
then resumed; bulk cancels of every job of the load's dedicated type (`BULK_TYPE`:
pending ones cancelled at once, running ones asked to stop); and bulk retries of the
dead letters among the load's jobs that sleep past their timeout and are not cancelled
one by one (by `ids` and `status`), once more when the faults are over (`finish`), as the
last ones dead-letter late. Like the load's own requests, one without an answer, or a
503, is sent again to the other API until a 200 comes back (each sent request is
recorded: an unanswered one may have applied); any other answer is a failure of the run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from tests.chaos.evidence import BulkAction, QueuePause

PAUSED_QUEUE = "bulk"
PAUSES = 3
PAUSE_SECONDS = 3.0
BULK_TYPE = "chaos-bulk"
# When each step comes, as a share of the fault phase.
PAUSE_AT = (0.1, 0.4, 0.7)
CANCEL_AT = (0.2, 0.5, 0.9)
RETRY_AT = (0.5,)
GIVE_UP = 60.0
MAX_IDS = 1000  # what one bulk request may name


class Operator:
    """Pauses, bulk cancels and bulk retries over `duration` seconds from `start()`.
    `apis()`: the APIs to ask now (the load's rotation); `retry_ids()`: the jobs a bulk
    retry may name."""

    def __init__(
        self,
        apis: Callable[[], Sequence[str]],
        retry_ids: Callable[[], Sequence[str]],
        duration: float,
        log: Callable[[str], None] = print,
    ) -> None:
        self.apis = apis
        self.retry_ids = retry_ids
        self.duration = duration
        self.log = log
        self.pauses: list[QueuePause] = []
        self.actions: list[BulkAction] = []
        self.failures: list[str] = []
        self._http = httpx.Client(timeout=5.0)
        self._serial = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="operator", daemon=True)

    def start(self) -> None:
        self._began = time.time()
        self._thread.start()

    def finish(self) -> None:
        """Wait for the schedule, then retry the dead letters once more."""
        self._thread.join(max(0.0, self._began + self.duration - time.time()) + 3 * GIVE_UP)
        if self._thread.is_alive():
            self.failures.append("operator: its schedule did not finish")
            self._stop.set()
            return
        try:
            self._bulk("retry")
        except Exception as exc:  # as in the schedule
            self.failures.append(f"operator: {exc!r}")

    def close(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(GIVE_UP)
        self._http.close()

    def _run(self) -> None:
        steps: list[tuple[float, str]] = sorted(
            [(at, "pause") for at in PAUSE_AT[:PAUSES]]
            + [(at, "cancel") for at in CANCEL_AT]
            + [(at, "retry") for at in RETRY_AT]
        )
        try:
            for at, step in steps:
                if self._stop.wait(max(0.0, self._began + at * self.duration - time.time())):
                    return
                if step == "pause":
                    self._pause()
                else:
                    self._bulk(step)
        except Exception as exc:  # recorded: the run must fail, not hang
            self.failures.append(f"operator: {exc!r}")

    def _pause(self) -> None:
        sent, answered, _ = self._ask(f"/queues/{PAUSED_QUEUE}/pause", None, "pause")
        if answered is not None:
            self._stop.wait(PAUSE_SECONDS)
        # Resumed even if the pause was never answered: it may have applied.
        resume_sent, resumed, _ = self._ask(f"/queues/{PAUSED_QUEUE}/resume", None, "resume")
        if answered is not None:
            self.pauses.append(QueuePause(PAUSED_QUEUE, sent, answered, resume_sent, resumed))
            self.log(f"operator: {PAUSED_QUEUE} paused {resume_sent - answered:.1f}s")

    def _bulk(self, action: str) -> None:
        if action == "cancel":
            body: dict[str, Any] = {"type": BULK_TYPE}
        else:
            ids = list(self.retry_ids())[-MAX_IDS:]
            if not ids:
                return
            body = {"ids": ids, "status": "dead_letter"}
        self._ask(f"/jobs/{action}", body, action)

    def _ask(
        self, path: str, body: dict[str, Any] | None, action: str
    ) -> tuple[float, float | None, dict[str, Any]]:
        """POST until a 200: when the first request was sent, when the 200 came (None:
        never) and its body. A bulk action records every request it sent."""
        self._serial += 1
        first = time.time()
        give_up = time.monotonic() + GIVE_UP
        attempt = 0
        while time.monotonic() < give_up:
            urls = list(self.apis())
            url = urls[(self._serial + attempt) % len(urls)]
            attempt += 1
            sent = time.time()
            try:
                response = self._http.post(f"{url}{path}", json=body)
            except httpx.HTTPError:
                if body is not None:
                    self.actions.append(BulkAction(action, body, sent))
                time.sleep(0.2)
                continue
            answered = time.time()
            answer = response.json() if response.status_code == 200 else {}
            if body is not None:
                self.actions.append(
                    BulkAction(action, body, sent, answered, response.status_code, answer)
                )
            if response.status_code == 200:
                return first, answered, answer
            if response.status_code != 503:
                self.failures.append(
                    f"POST {path} answered {response.status_code}: {response.text[:200]}"
                )
                return first, None, {}
            time.sleep(0.2)
        self.failures.append(f"POST {path}: no 200 within {GIVE_UP:g}s")
        return first, None, {}
