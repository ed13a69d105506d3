"""The lifecycle of one attempt in a job slot: its phases, why it was interrupted, and the
moves between phases that the executor (`jobqueue_worker.executor`) may make.

An attempt is claimed, runs its handler (in the attempt's task, or in a thread), may be
interrupted, and ends once its outcome is settled and the slot freed. A handler that
ignores its interruption is abandoned: the attempt is settled and freed without it, and
it runs on until it returns (an overrun). `Attempt.move` is the only way the phase or
the interruption changes, and it refuses any move `MOVES` and `REPLACES` do not declare.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any

from jobcore import logs
from jobcore.errors import JobqueueError
from jobcore.registry import JobContext
from jobcore.rows import Claimed
from jobcore.states import Operation


class Interruption(enum.StrEnum):
    """Why an attempt was told to stop; the values appear in log lines."""

    TIMEOUT = "timeout"
    SHUTDOWN = "shutdown"
    LEASE_LOST = "lease lost"
    CANCELLED = "cancelled"


class Phase(enum.Enum):
    CLAIMED = "claimed"  # in a slot, its handler not started
    IN_HANDLER = "in handler"  # the handler runs in the attempt's task
    IN_THREAD = "in thread"  # a plain handler runs in a thread of its own
    INTERRUPTED = "interrupted"  # told to stop, its task cancelled: cancel_grace to end
    INTERRUPTED_THREAD = "interrupted thread"  # told through ctx.cancelled: grace to return
    ENDED = "ended"  # the handler returned or raised: the outcome is being decided
    ABANDONED = "abandoned"  # the handler ignored its interruption and runs on without it
    SETTLED = "settled"  # the outcome went to the completer: the slot waits for the write
    DETACHED = "detached"  # settled without its abandoned handler, which still runs
    OVERRUN = "overrun"  # the slot is freed; the abandoned handler still runs
    FREED = "freed"  # the slot is freed and nothing of the attempt runs


MOVES: dict[Phase, frozenset[Phase]] = {
    # To itself: an interruption that came before the handler, acted on when it would start.
    Phase.CLAIMED: frozenset({Phase.CLAIMED, Phase.IN_HANDLER, Phase.SETTLED}),
    Phase.IN_HANDLER: frozenset({Phase.IN_THREAD, Phase.INTERRUPTED, Phase.ENDED}),
    # Back in the task: what the thread returned is awaited there. Abandoned: its task was
    # cancelled from outside (the loop closing), and a thread cannot be stopped.
    Phase.IN_THREAD: frozenset(
        {Phase.IN_HANDLER, Phase.INTERRUPTED_THREAD, Phase.ENDED, Phase.ABANDONED}
    ),
    # To itself: a cancel requested while a timeout or shutdown stops it.
    Phase.INTERRUPTED: frozenset({Phase.INTERRUPTED, Phase.ENDED, Phase.ABANDONED}),
    Phase.INTERRUPTED_THREAD: frozenset(
        {Phase.INTERRUPTED_THREAD, Phase.INTERRUPTED, Phase.ENDED, Phase.ABANDONED}
    ),
    Phase.ENDED: frozenset({Phase.SETTLED}),
    Phase.ABANDONED: frozenset({Phase.DETACHED}),
    Phase.SETTLED: frozenset({Phase.FREED}),
    # The abandoned handler returns before the outcome is written, or after (an overrun).
    Phase.DETACHED: frozenset({Phase.SETTLED, Phase.OVERRUN}),
    Phase.OVERRUN: frozenset({Phase.FREED}),
    Phase.FREED: frozenset(),
}

# The interruptions that may replace the current one (None: not interrupted). A cancel
# overrides the timeout or shutdown stopping the attempt, so it is recorded as asked; a
# lease lost before the handler starts overrides a cancel, since nothing may be written.
REPLACES: dict[Interruption | None, frozenset[Interruption]] = {
    None: frozenset(Interruption),
    Interruption.TIMEOUT: frozenset({Interruption.CANCELLED}),
    Interruption.SHUTDOWN: frozenset({Interruption.CANCELLED}),
    Interruption.CANCELLED: frozenset({Interruption.LEASE_LOST}),
    Interruption.LEASE_LOST: frozenset(),
}

# Where an interruption takes a running handler; where it goes when what its thread
# returned is awaited in the task.
STOPPED_BY = {Phase.IN_HANDLER: Phase.INTERRUPTED, Phase.IN_THREAD: Phase.INTERRUPTED_THREAD}
BACK_IN_TASK = {Phase.IN_THREAD: Phase.IN_HANDLER, Phase.INTERRUPTED_THREAD: Phase.INTERRUPTED}
_STOPPING = frozenset(STOPPED_BY.values())
# Phases in which the outcome is settled: nothing more is decided for the attempt.
SETTLED = frozenset({Phase.SETTLED, Phase.DETACHED, Phase.OVERRUN, Phase.FREED})


class LifecycleError(JobqueueError, AssertionError):
    """A move the attempt's lifecycle does not declare: a fault in the executor."""


class Attempt:
    """One job in a slot, from start until its outcome is recorded and its handler ended."""

    __slots__ = (
        "ctx",
        "delay",
        "duration",
        "error",
        "fields",
        "interrupted",
        "job",
        "kind",
        "lease_deadline",
        "phase",
        "result",
        "span",
        "started",
        "task",
        "timer",
        "traceback",
    )

    def __init__(self, job: Claimed, lease_deadline: float) -> None:
        self.job = job
        self.lease_deadline = lease_deadline
        self.fields = logs.Fields(
            job_id=str(job.id), job_type=job.type, attempt=job.attempts, lease_token=job.lease_token
        )
        self.phase = Phase.CLAIMED
        self.interrupted: Interruption | None = None
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None  # for cancel_grace, once interrupted
        self.ctx: JobContext | None = None  # once the handler starts
        self.kind = Operation.COMPLETE  # set for real when the attempt settles
        self.error: str | None = None
        self.traceback: str | None = None  # a failure's, formatted (jobqueue_worker.failures)
        self.result: str | None = None  # complete: the return value as JSON text
        self.delay = 0.0
        self.started = 0.0
        self.duration = 0.0
        self.span: Any = None  # the attempt's span, when tracing is on

    def deadline(self) -> float:
        """When the lease runs out (monotonic), as the heartbeat last extended it."""
        return self.lease_deadline

    @property
    def settled(self) -> bool:
        """The outcome went to the completer (or was dropped): a cancel changes nothing."""
        return self.phase in SETTLED

    def move(self, to: Phase, reason: Interruption | None = None) -> None:
        """Go to phase `to`, interrupted for `reason` if given; LifecycleError if MOVES or
        REPLACES does not allow it, or if it would stop the attempt with no reason."""
        if to not in MOVES[self.phase]:
            raise LifecycleError(f"attempt {self.job.id}: no move from {self.phase} to {to}")
        if reason is not None:
            if reason not in REPLACES[self.interrupted]:
                raise LifecycleError(
                    f"attempt {self.job.id} in {self.phase}: interruption {reason!r}"
                    f" cannot replace {self.interrupted!r} (moving to {to})"
                )
            self.interrupted = reason
        elif to in _STOPPING and self.interrupted is None:
            raise LifecycleError(
                f"attempt {self.job.id}: no move from {self.phase} to {to} without a reason"
            )
        self.phase = to

    def settle(self) -> None:
        """The outcome is decided (handed to the completer, or nothing to write)."""
        self.move(Phase.DETACHED if self.phase is Phase.ABANDONED else Phase.SETTLED)

    def free(self) -> None:
        """The slot is freed; an abandoned handler may still run."""
        self.move(Phase.OVERRUN if self.phase is Phase.DETACHED else Phase.FREED)

    def returned_late(self) -> None:
        """The abandoned handler, settled without it, has returned."""
        self.move(Phase.FREED if self.phase is Phase.OVERRUN else Phase.SETTLED)
