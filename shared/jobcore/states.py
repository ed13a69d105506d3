"""Job statuses and the state machine: the one place operations and transitions are defined.

Each `Operation` is declared once, here, with the status it may start from (its
guard) and the statuses it may lead to. `jobcore.queries` holds one statement per
operation and takes its guard and target from the declaration, so the SQL
cannot drift from this table; `next_operation` decides how an attempt ends.
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Declared:
    name: str
    sources: frozenset[Status]
    targets: frozenset[Status]
    outcome: str
    gives_back: bool
    due_again: bool
    writes_error: bool
    writes_result: bool
    delay_grows: bool


def _op(
    name: str,
    *,
    sources: Status | tuple[Status, ...],
    targets: Status | tuple[Status, ...],
    outcome: str = "",
    gives_back: bool = False,
    due_again: bool = False,
    writes_error: bool = False,
    writes_result: bool = False,
    delay_grows: bool = False,
) -> _Declared:
    def statuses(given: Status | tuple[Status, ...]) -> frozenset[Status]:
        return frozenset(given if isinstance(given, tuple) else (given,))

    return _Declared(
        name,
        statuses(sources),
        statuses(targets),
        outcome,
        gives_back,
        due_again,
        writes_error,
        writes_result,
        delay_grows,
    )


class Operation(StrEnum):
    """A store operation, declared once with its effects: the statuses it may start from
    (its guard) and where it may lead; for the writes that end an attempt, the outcome they
    record (in logs and metrics); whether it gives the attempt back (`gives_back`: attempts
    less one), makes the job due again later (`due_again`: run_at = now() + a delay, the
    caller's, or with `delay_grows` one the statement derives from the job's own `errors`),
    and writes the attempt's error (`writes_error`: `last_error`, and an entry of `errors`
    with its traceback) or the handler's result (`writes_result`).
    The outcome statements (`jobcore.queries.job_outcome`), the worker's calls, the
    in-memory store and the worker's executor and completer read these; nothing restates
    them."""

    sources: frozenset[Status]
    targets: frozenset[Status]
    outcome: str
    gives_back: bool
    due_again: bool
    writes_error: bool
    writes_result: bool
    delay_grows: bool

    def __new__(cls, declared: _Declared) -> Operation:
        op = str.__new__(cls, declared.name)
        op._value_ = declared.name
        op.sources = declared.sources
        op.targets = declared.targets
        op.outcome = declared.outcome
        op.gives_back = declared.gives_back
        op.due_again = declared.due_again
        op.writes_error = declared.writes_error
        op.writes_result = declared.writes_result
        op.delay_grows = declared.delay_grows
        return op

    # The writes that end an attempt, in the order a batch of outcomes is written. Those that
    # would make the job due again end it `cancelled` instead when a cancel was requested.
    COMPLETE = _op(
        "complete", outcome="completed", sources=_R, targets=Status.COMPLETED, writes_result=True
    )
    FAIL = _op("fail", outcome="failed", sources=_R, targets=Status.FAILED, writes_error=True)
    DEAD_LETTER = _op(
        "dead_letter",
        outcome="dead_letter",
        sources=_R,
        targets=Status.DEAD_LETTER,
        writes_error=True,
    )
    # The holder stopped the attempt because a cancel was requested.
    CANCEL_ATTEMPT = _op("cancel_attempt", outcome="cancelled", sources=_R, targets=_X)
    RETRY_LATER = _op(
        "retry_later",
        outcome="retried",
        sources=_R,
        targets=(_P, _X),
        due_again=True,
        writes_error=True,
    )
    # The handler asked to run later (`Snooze`): the attempt is given back.
    SNOOZE = _op(
        "snooze", outcome="snoozed", sources=_R, targets=(_P, _X), gives_back=True, due_again=True
    )
    # Shutdown interrupted the attempt through no fault of the job: the attempt is given back.
    RELEASE = _op("release", outcome="released", sources=_R, targets=(_P, _X), gives_back=True)
    # The worker has no handler for the job's type (during a rolling deploy a submitter may
    # know a type before the workers do): the attempt is given back, the error recorded, and
    # the job due again after a delay that doubles with each such give-back of the same
    # attempt (`unhandled_delay`), so it waits for a worker that has the code.
    UNHANDLED = _op(
        "unhandled",
        outcome="unhandled",
        sources=_R,
        targets=(_P, _X),
        gives_back=True,
        due_again=True,
        writes_error=True,
        delay_grows=True,
    )
    # Everything else.
    CLAIM = _op("claim", sources=_P, targets=_R)
    # The jobs of a claim whose answer never reached its worker: the attempt is given back.
    RELEASE_CLAIM = _op("release_claim", sources=_R, targets=(_P, _X), gives_back=True)
    RECOVER_EXPIRED = _op(
        "recover_expired", sources=_R, targets=(_P, Status.DEAD_LETTER, _X), writes_error=True
    )
    # The lease of a running attempt extended (a heartbeat): no change of status.
    RENEW = _op("renew", sources=_R, targets=_R)
    # An operator's retry of a job that ended without success: a fresh attempt budget.
    MANUAL_RETRY = _op("manual_retry", sources=(Status.DEAD_LETTER, Status.FAILED, _X), targets=_P)
    # An operator's cancel of a job no worker holds: at once.
    CANCEL = _op("cancel", sources=(_P, Status.DEAD_LETTER), targets=_X)
    # An operator's cancel of a running job: recorded on the job (no change of status) and
    # announced; the holder stops the attempt and writes `cancel_attempt`.
    REQUEST_CANCEL = _op("request_cancel", sources=_R, targets=_R)


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


# An unhandled job is due again after 1 s, then 2 s, 4 s ... at most 60 s.
UNHANDLED_DELAY_FIRST = 1.0
UNHANDLED_DELAY_MAX = 60.0


def unhandled_delay(given_back: int) -> float:
    """Seconds until a job given back for want of a handler is due again, after `given_back`
    earlier such give-backs of the same attempt. `unhandled`'s statement renders the same
    rule in SQL from these constants (`jobcore.queries.job_outcome`); the conformance suite
    holds both to it."""
    return min(UNHANDLED_DELAY_FIRST * 2.0 ** min(given_back, 16), UNHANDLED_DELAY_MAX)


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
