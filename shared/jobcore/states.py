"""Job statuses and the state machine: the one place transitions are defined.

Every store statement takes its guard (`WHERE status = ...`) and its target
from `OPERATIONS`, so the SQL cannot drift from this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"
    DEAD_LETTER = "dead_letter"


TERMINAL = frozenset({Status.COMPLETED, Status.FAILED})


@dataclass(frozen=True)
class Operation:
    """A store operation: the status it may start from and where it may lead."""

    name: str
    source: Status
    targets: frozenset[Status]


def _op(name: str, source: Status, *targets: Status) -> Operation:
    return Operation(name, source, frozenset(targets))


OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        _op("claim", Status.PENDING, Status.PROCESSING),
        _op("complete", Status.PROCESSING, Status.COMPLETED),
        _op("retry_later", Status.PROCESSING, Status.PENDING),
        _op("release", Status.PROCESSING, Status.PENDING),
        _op("release_claim", Status.PROCESSING, Status.PENDING),
        _op("recover_expired", Status.PROCESSING, Status.PENDING, Status.DEAD_LETTER),
        _op("fail", Status.PROCESSING, Status.FAILED),
        _op("dead_letter", Status.PROCESSING, Status.DEAD_LETTER),
        _op("manual_retry", Status.DEAD_LETTER, Status.PENDING),
    )
}

# The edges of the state machine, derived from the operations above.
TRANSITIONS: frozenset[tuple[Status, Status]] = frozenset(
    (op.source, target) for op in OPERATIONS.values() for target in op.targets
)


def source(operation: str) -> Status:
    return OPERATIONS[operation].source
