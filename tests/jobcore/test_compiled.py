"""jobcore.compiled: the worker's statements are jobcore.store's constructs compiled, with
no second copy to drift, and parameters are ordered as the compiled SQL expects."""

from __future__ import annotations

from sqlalchemy.dialects import postgresql

from jobcore import compiled, maintenance, search, store
from jobcore.states import ATTEMPT_OUTCOMES, Operation


def test_every_statement_the_worker_runs_is_its_jobcore_construct_compiled():
    dialect = postgresql.asyncpg.dialect()
    constructs = {
        **store.WORKER_STATEMENTS,
        "queue_depths": search.QUEUE_DEPTHS,
        "take_lead": maintenance.TAKE_LEAD,
        "resign": maintenance.RESIGN,
        **{f"prune_{status}": statement for status, statement in maintenance.PRUNE.items()},
        "table_stats": maintenance.TABLE_STATS,
    }
    assert set(compiled.STATEMENTS) == set(constructs)
    for name, construct in constructs.items():
        assert compiled.STATEMENTS[name].sql == construct.compile(dialect=dialect).string, name


def test_every_operation_but_the_apis_has_a_worker_statement():
    assert set(Operation) - set(compiled.STATEMENTS) == {
        Operation.MANUAL_RETRY,
        Operation.CANCEL,
        Operation.REQUEST_CANCEL,
    }


def test_outcome_writes_take_leases_and_only_the_arrays_they_use():
    expected = {
        Operation.COMPLETE: {"ids", "tokens", "results"},
        Operation.CANCEL_ATTEMPT: {"ids", "tokens"},
        Operation.RELEASE: {"ids", "tokens"},
        Operation.FAIL: {"ids", "tokens", "errors"},
        Operation.DEAD_LETTER: {"ids", "tokens", "errors"},
        Operation.RETRY_LATER: {"ids", "tokens", "errors", "delays"},
        Operation.SNOOZE: {"ids", "tokens", "delays"},
    }
    assert {op: compiled.STATEMENTS[op].parameters for op in ATTEMPT_OUTCOMES} == expected


def test_arguments_follow_the_compiled_sql_and_fill_the_constructs_own_literals():
    claim = compiled.STATEMENTS[Operation.CLAIM]
    assert claim.parameters == {
        "queues",
        "slots",
        "lease_seconds",
        "claim",
        *compiled.NO_FLOORS,
    }
    args = claim.args(
        {
            "queues": ["q"],
            "slots": [7],
            "lease_seconds": 30.0,
            "claim": "c",
            "floor_queues": ["fq"],
            "floor_priorities": [3],
            "floors": ["f"],
        }
    )
    # attempts + 1 and lease_token + 1 are the construct's own literals.
    assert sorted(map(str, args)) == sorted(
        ["1", "1", "['q']", "[7]", "30.0", "c", "['fq']", "[3]", "['f']"]
    )
    for position, value in enumerate(args, start=1):
        assert f"${position}" in claim.sql, value
