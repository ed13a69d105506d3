"""The state machine in jobcore is exactly the documented one (README, "Job lifecycle"), and
the decision how an attempt ends follows the documented rules (docs/worker.md, "Record")."""

import pytest

from jobcore.errors import PermanentError, Snooze
from jobcore.states import (
    ATTEMPT_OUTCOMES,
    FINISHED,
    TRANSITIONS,
    Operation,
    Status,
    next_operation,
    out_of_attempts,
)

P, R, C, F, D, X = (
    Status.PENDING,
    Status.PROCESSING,
    Status.COMPLETED,
    Status.FAILED,
    Status.DEAD_LETTER,
    Status.CANCELLED,
)

# The documented lifecycle, written out independently of jobcore.
DOCUMENTED_TRANSITIONS = {
    (P, R),
    (R, C),
    (R, P),
    (R, F),
    (R, D),
    (D, P),
    (F, P),
    (X, P),
    (P, X),
    (D, X),
    (R, X),
}


def test_transition_table_is_the_documented_one():
    assert TRANSITIONS == DOCUMENTED_TRANSITIONS


def test_completed_is_final_and_only_an_operator_brings_failed_jobs_back():
    sources = {source for op in Operation for source in op.sources}
    assert C not in sources
    assert [op for op in Operation if F in op.sources] == [Operation.MANUAL_RETRY]
    assert all(op.sources and op.targets for op in Operation)


def test_attempt_outcomes_end_processing_in_one_status_each_and_name_their_outcome():
    assert [op.value for op in ATTEMPT_OUTCOMES] == [
        "complete",
        "fail",
        "dead_letter",
        "cancel_attempt",
        "retry_later",
        "snooze",
        "release",
        "unhandled",
    ]
    for op in ATTEMPT_OUTCOMES:
        assert op.sources == {R} and op.outcome
        # Those that let the job run again end it cancelled when a cancel was requested.
        assert R not in op.targets and len(op.targets - {X}) <= 1 and op.targets
    assert {op for op in ATTEMPT_OUTCOMES if X in op.targets and len(op.targets) == 2} == {
        Operation.RETRY_LATER,
        Operation.SNOOZE,
        Operation.RELEASE,
        Operation.UNHANDLED,
    }
    assert {op.outcome for op in ATTEMPT_OUTCOMES} == {
        "completed",
        "failed",
        "dead_letter",
        "cancelled",
        "retried",
        "snoozed",
        "released",
        "unhandled",
    }


def test_only_an_operator_or_the_holder_cancels_and_only_an_operator_revives_a_cancelled_job():
    assert {op for op in Operation if X in op.targets} == {
        Operation.CANCEL,
        Operation.CANCEL_ATTEMPT,
        Operation.RETRY_LATER,
        Operation.SNOOZE,
        Operation.RELEASE,
        Operation.UNHANDLED,
        Operation.RELEASE_CLAIM,
        Operation.RECOVER_EXPIRED,
    }
    assert [op for op in Operation if X in op.sources] == [Operation.MANUAL_RETRY]
    assert {C, F, D, X} == FINISHED


@pytest.mark.parametrize(
    ("failure", "attempt", "max_attempts", "expected"),
    [
        (None, 1, 1, Operation.COMPLETE),
        (None, 5, 5, Operation.COMPLETE),
        (PermanentError("bad"), 1, 5, Operation.FAIL),
        (PermanentError("bad"), 5, 5, Operation.FAIL),
        (RuntimeError("flaky"), 1, 5, Operation.RETRY_LATER),
        (RuntimeError("flaky"), 4, 5, Operation.RETRY_LATER),
        (RuntimeError("flaky"), 5, 5, Operation.DEAD_LETTER),
        (TimeoutError(), 1, 1, Operation.DEAD_LETTER),
        (SystemExit(3), 1, 2, Operation.RETRY_LATER),
        (Snooze("5m"), 1, 1, Operation.SNOOZE),  # on the last attempt too: it is given back
    ],
)
def test_next_operation_decides_how_an_attempt_ends(failure, attempt, max_attempts, expected):
    assert next_operation(failure, attempt, max_attempts) is expected


def test_the_last_attempt_rule_is_one_expression_for_python_and_sql():
    import sqlalchemy as sa

    from jobcore.schema import jobs

    assert out_of_attempts(3, 3) and out_of_attempts(4, 3) and not out_of_attempts(2, 3)
    condition = out_of_attempts(jobs.c.attempts, jobs.c.max_attempts)
    assert str(condition.compile(compile_kwargs={"literal_binds": True})) == (
        "jobqueue.jobs.attempts >= jobqueue.jobs.max_attempts"
    )
    assert isinstance(condition, sa.ColumnElement)
