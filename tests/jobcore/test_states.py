"""The transition table in jobcore is exactly the one in SPEC §3."""

from jobcore.states import OPERATIONS, TRANSITIONS, Status

P, R, C, F, D = (
    Status.PENDING,
    Status.PROCESSING,
    Status.COMPLETED,
    Status.FAILED,
    Status.DEAD_LETTER,
)

# SPEC §3, written out independently of jobcore.
SPEC_TRANSITIONS = {(P, R), (R, C), (R, P), (R, F), (R, D), (D, P)}


def test_transition_table_matches_the_spec():
    assert TRANSITIONS == SPEC_TRANSITIONS


def test_every_operation_starts_from_one_status_and_terminal_states_have_no_exit():
    sources = {op.source for op in OPERATIONS.values()}
    assert C not in sources and F not in sources
    assert all(op.targets for op in OPERATIONS.values())
