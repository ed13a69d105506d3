"""Liveness of a worker process's event loop, shared with the supervisor.

The supervisor makes a `Beacon` (shared memory) for each child it spawns. In
the child, a loop callback writes the time of the loop's last turn every BEAT
seconds (nothing per job), and the child publishes its state and its count of
abandoned handlers there. A `Watchdog` thread in the child notices when the loop
has not turned for REPORT_AFTER: it logs the running jobs, the one whose handler
blocks the loop, and where the loop thread is, and leaves that report in the
beacon, where the supervisor finds it when it kills the child for the stall.

Times are `time.monotonic()`, one clock for every process of the machine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.context import BaseContext
from typing import Any

from jobcore.notifications import OK, UNCHECKED, UNHEARD

log = logging.getLogger("jobqueue.worker")

BEAT = 0.5
# The loop has not turned for this long: the child's watchdog logs what it is running.
REPORT_AFTER = 1.5
# A watchdog or supervisor check that itself ran this late was not running either
# (SIGSTOP, a suspended machine): it judges nothing on that round.
OWN_LATENESS = 1.5

STARTING, RUNNING, STOPPING, RECYCLING = 0, 1, 2, 3
_BEAT, _STATE, _ABANDONED, _NOTIFICATIONS = 0, 1, 2, 3
# The notification check's verdicts (`jobcore.notifications`), as the beacon holds them.
_VERDICTS = (UNCHECKED, OK, UNHEARD)
_REPORT_BYTES = 4096


class Beacon:
    """One child's heartbeat, state, abandoned handlers, notification check and stall
    report, in shared memory."""

    def __init__(self, context: BaseContext) -> None:
        # Unlocked: each value has one writer, and an aligned double is written whole.
        self._values: Any = context.RawArray("d", 4)
        self._report: Any = context.RawArray("c", _REPORT_BYTES)

    # --- written by the child -------------------------------------------------------

    def beat(self) -> None:
        self._values[_BEAT] = time.monotonic()

    def set_state(self, state: int) -> None:
        self._values[_STATE] = state

    def set_abandoned(self, count: int) -> None:
        self._values[_ABANDONED] = count

    def set_notifications(self, verdict: str) -> None:
        self._values[_NOTIFICATIONS] = _VERDICTS.index(verdict)

    def set_report(self, report: dict[str, Any] | None) -> None:
        data = b"" if report is None else json.dumps(report).encode()[: _REPORT_BYTES - 1]
        self._report.value = data

    # --- read by the supervisor -----------------------------------------------------

    @property
    def last_beat(self) -> float:
        """When the child's loop last turned; 0 until it first has."""
        return float(self._values[_BEAT])

    @property
    def state(self) -> int:
        return int(self._values[_STATE])

    @property
    def abandoned(self) -> int:
        return int(self._values[_ABANDONED])

    @property
    def notifications(self) -> str:
        return _VERDICTS[int(self._values[_NOTIFICATIONS])]

    def report(self) -> dict[str, Any]:
        try:
            found = json.loads(self._report.value or b"{}")
        except ValueError:  # cut short, or read while being written
            return {}
        return found if isinstance(found, dict) else {}


def start_heartbeat(beacon: Beacon) -> Callable[[], None]:
    """Beat now and every BEAT seconds on the running loop; returns what stops it."""
    loop = asyncio.get_running_loop()
    handle: list[asyncio.TimerHandle] = []

    def beat() -> None:
        beacon.beat()
        handle[:] = [loop.call_later(BEAT, beat)]

    beat()
    return lambda: handle[0].cancel()


RunningJobs = Callable[[], list[tuple[str, bool]]]


class Watchdog(threading.Thread):
    """Reports, from outside the loop, a loop that has stopped turning; see the module."""

    def __init__(self, beacon: Beacon, running_jobs: RunningJobs, fields: dict[str, Any]) -> None:
        super().__init__(name="loop-watchdog", daemon=True)
        self._beacon = beacon
        self._running_jobs = running_jobs
        self._fields = fields
        self._loop_thread = threading.get_ident()  # made on the loop's thread
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        reported = False
        checked = time.monotonic()
        while not self._stop.wait(BEAT):
            now = time.monotonic()
            late, checked = now - checked > BEAT + OWN_LATENESS, now
            if late:
                continue
            blocked = now - self._beacon.last_beat
            if blocked > REPORT_AFTER and not reported:
                reported = True
                self._report(blocked)
            elif blocked <= REPORT_AFTER and reported:
                reported = False
                self._beacon.set_report(None)
                log.info("event loop running again", extra=self._fields)

    def _report(self, blocked: float) -> None:
        try:
            jobs = self._running_jobs()
        except RuntimeError:  # the loop changed them meanwhile: it is not stuck after all
            return
        blocking = next((job for job, running in jobs if running), None)
        report = {
            "job_id": blocking,
            "running_jobs": [job for job, _ in jobs],
            "where": self._where(),
        }
        self._beacon.set_report(report)
        log.warning(
            "event loop blocked",
            extra={**self._fields, **report, "blocked_for": round(blocked, 3)},
        )

    def _where(self) -> list[str]:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return []
        stack = traceback.extract_stack(frame)[-6:]
        return [f"{f.filename}:{f.lineno} {f.name}" for f in stack]
