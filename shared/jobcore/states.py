"""Job statuses and the state machine: the one place operations and transitions are defined.

Each `Operation` is declared once, here, with the status it may start from (its
guard) and the statuses it may lead to. `jobcore.store` holds one statement per
operation and takes its guard and target from the declaration, so the SQL
cannot drift from this table; `next_operation` decides how an attempt ends.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from jobcore.errors import PermanentError, Snooze


class Status(StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"
    DEAD_LETTER = "dead_letter"
    CANCELLED = "cancelled"

    @classmethod
    def read(cls, value: str) -> Status:
        """A status as stored or as an API answered it: its member, or for a value this
        release does not know (a later release's, during a rollout: docs/upgrading.md) a
        stand-in that is none of the members, in no set of them (not finished, no
        operation's source) and shows the value as it is. For reading only: input to
        validate goes through `Status(value)`, which refuses what it does not know."""
        try:
            return cls(value)
        except ValueError:
            pass
        unknown = _UNKNOWN.get(value)
        if unknown is None:
            unknown = str.__new__(cls, value)
            unknown._name_ = "UNKNOWN"
            unknown._value_ = value
            if len(_UNKNOWN) < 64:  # a few new statuses at most; never grows without bound
                _UNKNOWN[value] = unknown
        return unknown


_UNKNOWN: dict[str, Status] = {}


_P, _R, _X = Status.PENDING, Status.PROCESSING, Status.CANCELLED

# Where a job ends up unless an operator acts: a waiter is answered, retention may prune it.
FINISHED: frozenset[Status] = frozenset(
    {Status.COMPLETED, Status.FAILED, Status.DEAD_LETTER, Status.CANCELLED}
)


class Operation(StrEnum):
    """A store operation: its name, the statuses it may start from (its guard), where it may
    lead, and, for the writes that end an attempt, the outcome they record (in logs and
    metrics)."""

    sources: frozenset[Status]
    targets: frozenset[Status]
    outcome: str

    def __new__(
        cls, name: str, outcome: str, sources: Status | tuple[Status, ...], *targets: Status
    ) -> Operation:
        op = str.__new__(cls, name)
        op._value_ = name
        op.outcome = outcome
        op.sources = frozenset(sources if isinstance(sources, tuple) else (sources,))
        op.targets = frozenset(targets)
        return op

    # The writes that end an attempt, in the order a batch of outcomes is written. Those that
    # would make the job due again end it `cancelled` instead when a cancel was requested.
    COMPLETE = "complete", "completed", _R, Status.COMPLETED
    FAIL = "fail", "failed", _R, Status.FAILED
    DEAD_LETTER = "dead_letter", "dead_letter", _R, Status.DEAD_LETTER
    # The holder stopped the attempt because a cancel was requested.
    CANCEL_ATTEMPT = "cancel_attempt", "cancelled", _R, _X
    RETRY_LATER = "retry_later", "retried", _R, _P, _X
    # The handler asked to run later (`Snooze`): the attempt is given back.
    SNOOZE = "snooze", "snoozed", _R, _P, _X
    # Shutdown interrupted the attempt through no fault of the job: the attempt is given back.
    RELEASE = "release", "released", _R, _P, _X
    # Everything else.
    CLAIM = "claim", "", _P, _R
    # The jobs of a claim whose answer never reached its worker: the attempt is given back.
    RELEASE_CLAIM = "release_claim", "", _R, _P, _X
    RECOVER_EXPIRED = "recover_expired", "", _R, _P, Status.DEAD_LETTER, _X
    # The lease of a running attempt extended (a heartbeat): no change of status.
    RENEW = "renew", "", _R, _R
    # An operator's retry of a job that ended without success: a fresh attempt budget.
    MANUAL_RETRY = "manual_retry", "", (Status.DEAD_LETTER, Status.FAILED, _X), _P
    # An operator's cancel of a job no worker holds: at once.
    CANCEL = "cancel", "", (_P, Status.DEAD_LETTER), _X
    # An operator's cancel of a running job: recorded on the job (no change of status) and
    # announced; the holder stops the attempt and writes `cancel_attempt`.
    REQUEST_CANCEL = "request_cancel", "", _R, _R


# The operations that record how an attempt ended, in write order.
ATTEMPT_OUTCOMES: tuple[Operation, ...] = tuple(op for op in Operation if op.outcome)

# The edges of the state machine, derived from the operations above.
TRANSITIONS: frozenset[tuple[Status, Status]] = frozenset(
    (source, target)
    for op in Operation
    for source in op.sources
    for target in op.targets
    if target is not source
)


def out_of_attempts(attempts: Any, max_attempts: Any) -> Any:
    """Whether the attempt just made was the last: a bool for ints in Python, a condition for
    columns in SQL (`recover_expired`), so that both decide by this one rule."""
    return attempts >= max_attempts


def next_operation(failure: BaseException | None, attempt: int, max_attempts: int) -> Operation:
    """How an attempt that ended with `failure` (None: the handler returned) is recorded."""
    if failure is None:
        return Operation.COMPLETE
    if isinstance(failure, Snooze):
        return Operation.SNOOZE
    if isinstance(failure, PermanentError):
        return Operation.FAIL
    if out_of_attempts(attempt, max_attempts):
        return Operation.DEAD_LETTER
    return Operation.RETRY_LATER
