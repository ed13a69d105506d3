"""The periodic scheduler: each worker process submits the jobs of the declared schedules
(`jobcore.periodic`) at their ticks, and the database keeps one job per tick.

There is no leader. Every process that has schedules sleeps until the next tick of any
of them, then submits, per due schedule, a job with idempotency key
`periodic:<name>:<tick>` and `run_at` = the tick (so a process whose clock runs early
cannot start it before the tick, by the database's clock). The unique key makes the
first insert win; the other processes get that job back (a replay, not logged above
debug). A key bound to a different request (the schedule's payload or routing changed
between deploys while old processes still run) is logged and the tick skipped here.

Only ticks after the process started are submitted, and a tick only within GRACE of its
time: a failed submission (database down) is retried until then, and a tick still not
submitted is given up, so an outage or a stopped fleet never replays old ticks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import store
from jobcore.backoff import Retry
from jobcore.errors import IdempotencyConflict, describe
from jobcore.ids import new_id
from jobcore.periodic import Schedule, tick_text
from jobcore.registry import get_handler, handler_options
from jobcore.rows import Job, NewJob
from jobqueue_worker.loops import Loop

log = logging.getLogger("jobqueue.worker")
T = TypeVar("T")

# How late a tick may still be submitted, in seconds.
GRACE = 60.0
# The longest sleep between rounds: ticks are on the wall clock, sleeps on the monotonic
# one, so a stepped clock is noticed within this.
_MAX_SLEEP = 15.0
_MIN_SLEEP = 0.005
# One submission, connection included; far below GRACE so a hung one is retried in time.
_SUBMIT_TIMEOUT = 10.0


def _now() -> datetime:
    return datetime.now(UTC)


def _first(given: T | None, option: T | None) -> T | None:
    """The schedule's own field, else the handler's option (None: the global default)."""
    return given if given is not None else option


class Scheduler(Loop):
    """Submits each schedule's job at every tick after the process started."""

    name = "periodic"

    def __init__(
        self,
        engine: AsyncEngine,
        schedules: Sequence[Schedule],
        *,
        max_attempts: int,
        grace: float = GRACE,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        super().__init__(_MAX_SLEEP, Retry(0.25, 5.0))
        if not schedules:
            raise ValueError("periodic: a scheduler needs at least one schedule")
        if grace <= 0:
            raise ValueError(f"periodic: grace must be positive, got {grace}")
        self._engine = engine
        self._schedules = list(schedules)
        self._max_attempts = max_attempts
        self._grace = timedelta(seconds=grace)
        self._clock = clock
        started = clock()
        # Per schedule, the next tick to submit: every earlier one is done or given up.
        self._due = {s.name: s.next_tick(started) for s in self._schedules}
        for s in self._schedules:
            if get_handler(s.type) is None:
                log.warning(
                    "periodic schedule has no handler in this process",
                    extra={"schedule": s.name, "type": s.type},
                )

    async def run_once(self) -> list[Job]:
        """Submit every due tick; returns the jobs this process created. A failed
        submission raises, and its tick is tried again by the next round."""
        now = self._clock()
        oldest = now - self._grace
        created = []
        for schedule in self._schedules:
            tick = self._due[schedule.name]
            if tick < oldest:
                tick = self._give_up(schedule, tick, oldest)
            while tick <= now:
                job = await self._submit(schedule, tick)
                if job is not None:
                    created.append(job)
                tick = schedule.next_tick(tick)
                self._due[schedule.name] = tick
        # Loop.run waits `interval` after a round that succeeded: here, until the next tick.
        wait = (min(self._due.values()) - self._clock()).total_seconds()
        self.interval = min(max(wait, _MIN_SLEEP), _MAX_SLEEP)
        return created

    def _give_up(self, schedule: Schedule, tick: datetime, oldest: datetime) -> datetime:
        due = schedule.next_tick(oldest)
        log.warning(
            "periodic ticks skipped",
            extra={
                "schedule": schedule.name,
                "first_skipped": tick_text(tick),
                "last_skipped": tick_text(schedule.last_tick(oldest)),
                "grace_seconds": self._grace.total_seconds(),
            },
        )
        self._due[schedule.name] = due
        return due

    def new_job(self, schedule: Schedule, tick: datetime) -> NewJob:
        """The job of `schedule` for `tick`: what the schedule leaves out, the handler's
        options give (explicit field > handler option > global default)."""
        options = handler_options(schedule.type)
        return NewJob(
            id=new_id(),
            type=schedule.type,
            payload=schedule.payload,
            max_attempts=_first(schedule.max_attempts, options.max_attempts) or self._max_attempts,
            idempotency_key=schedule.key(tick),
            queue=_first(schedule.queue, options.queue) or "default",
            priority=_first(schedule.priority, options.priority) or 0,
            run_at=tick,
            timeout=_first(schedule.timeout, options.timeout),
        )

    async def _submit(self, schedule: Schedule, tick: datetime) -> Job | None:
        new = self.new_job(schedule, tick)
        try:
            async with asyncio.timeout(_SUBMIT_TIMEOUT), self._engine.begin() as conn:
                job, created = await store.submit(conn, new, notify=True)
        except IdempotencyConflict as exc:
            log.warning(
                "periodic job conflict",
                extra={"schedule": schedule.name, "tick": tick_text(tick), "error": describe(exc)},
            )
            return None
        fields = {"schedule": schedule.name, "tick": tick_text(tick), "job_id": str(job.id)}
        if not created:
            log.debug("periodic job already submitted", extra=fields)
            return None
        log.info("periodic job submitted", extra=fields)
        return job
