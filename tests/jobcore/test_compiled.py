"""jobcore.compiled: every statement is its jobcore.queries construct compiled once, with no
second copy to drift, and parameters are ordered as the compiled SQL expects."""

from __future__ import annotations

from sqlalchemy.dialects import postgresql

from jobcore import compiled, queries, runner
from jobcore.states import ATTEMPT_OUTCOMES, Operation


def test_every_statement_is_its_jobcore_construct_compiled_once():
    dialect = postgresql.asyncpg.dialect()
    constructs = queries.named()
    assert set(compiled.STATEMENTS) == set(constructs)
    for name, construct in constructs.items():
        assert compiled.STATEMENTS[name].sql == construct.compile(dialect=dialect).string, name
        assert runner.of(construct) is compiled.STATEMENTS[name]  # one compile cache


def test_every_operation_has_its_statement_by_name():
    statement_of = {
        Operation.CLAIM: "job_claim",
        Operation.RELEASE_CLAIM: "job_release_claim",
        Operation.RECOVER_EXPIRED: "job_recover_expired",
        Operation.RENEW: "job_renew_many",
        Operation.MANUAL_RETRY: "job_retry",
        Operation.CANCEL: "job_cancel",
        Operation.REQUEST_CANCEL: "job_request_cancel",
        **{op: f"job_set_outcome_{op}" for op in ATTEMPT_OUTCOMES},
    }
    assert set(statement_of) == set(Operation)
    assert set(statement_of.values()) <= set(compiled.STATEMENTS)


def test_outcome_writes_take_leases_and_only_the_arrays_their_effects_need():
    expected = {
        Operation.COMPLETE: {"ids", "tokens", "results"},
        Operation.CANCEL_ATTEMPT: {"ids", "tokens"},
        Operation.RELEASE: {"ids", "tokens"},
        Operation.FAIL: {"ids", "tokens", "errors", "tracebacks"},
        Operation.DEAD_LETTER: {"ids", "tokens", "errors", "tracebacks"},
        Operation.RETRY_LATER: {"ids", "tokens", "errors", "tracebacks", "delays"},
        Operation.SNOOZE: {"ids", "tokens", "delays"},
        # Its delay is worked out in the statement (it grows with each give-back).
        Operation.UNHANDLED: {"ids", "tokens", "errors", "tracebacks"},
    }
    found = {op: compiled.STATEMENTS[f"job_set_outcome_{op}"].parameters for op in ATTEMPT_OUTCOMES}
    assert found == expected


def test_arguments_follow_the_compiled_sql_and_fill_the_constructs_own_literals():
    claim = compiled.STATEMENTS["job_claim_key_floors"]
    assert claim.parameters == {
        "queues",
        "slots",
        "lease_seconds",
        "claim",
        "holder",
        "key_limits",
        *compiled.NO_FLOORS,
        *compiled.NO_TURNS,
        *compiled.NO_OVERRUNS,
    }
    args = claim.args(
        {
            "queues": ["q"],
            "slots": [7],
            "lease_seconds": 30.0,
            "claim": "c",
            "holder": "h",
            "key_limits": [2],
            "floor_queues": ["fq"],
            "floor_priorities": [3],
            "floors": ["f"],
            "turn_queues": ["tq"],
            "turn_priorities": [4],
            "turns": ["t"],
            "key_floor_queues": ["kq"],
            "key_floor_priorities": [6],
            "key_floor_keys": ["kk"],
            "key_floors": ["kf"],
            "key_lease_floor": "kl",
            "overrun_queues": ["oq"],
            "overrun_keys": ["ok"],
            "overrun_counts": [5],
        }
    )
    # attempts + 1 and lease_token + 1 are the construct's own literals.
    assert sorted(map(str, args)) == sorted(
        [
            *("1", "1", "['q']", "[7]", "30.0", "c", "h", "[2]"),
            *("['fq']", "[3]", "['f']", "['tq']", "[4]", "['t']", "['oq']", "['ok']", "[5]"),
            *("['kq']", "[6]", "['kk']", "['kf']", "kl"),
        ]
    )
    for position, value in enumerate(args, start=1):
        assert f"${position}" in claim.sql, value
