"""Key turns: where a process's next claim at a queue and priority starts among the keys; and
which claims need keys in turn at all."""

from __future__ import annotations

from typing import NamedTuple

from jobcore.turns import KEYED_FOR, KEYED_PROBE, KeyedQueues, KeyTurns


class _Job(NamedTuple):
    queue: str
    priority: int
    concurrency_key: str | None


def _jobs(*keys: str | None, queue: str = "q", priority: int = 0) -> list[_Job]:
    return [_Job(queue, priority, key) for key in keys]


def test_a_first_claim_starts_from_the_first_key_and_ends_at_the_greatest_it_served():
    turns = KeyTurns()
    assert turns.params(["q"]) == {"turn_queues": [], "turn_priorities": [], "turns": []}
    turns.learn(_jobs(None, "b", "a", "b"))
    assert turns.last("q", 0) == "b"
    assert turns.params(["q", "other"]) == {
        "turn_queues": ["q"],
        "turn_priorities": [0],
        "turns": ["b"],
    }


def test_a_claim_that_went_round_ends_at_the_greatest_key_up_to_the_last_turn():
    turns = KeyTurns()
    turns.learn(_jobs("m"))
    # Served x (after m), then round again: '' (key-less) and a.
    turns.learn(_jobs("x", None, "a"))
    assert turns.last("q", 0) == "a"


def test_turns_are_kept_per_queue_and_priority_and_in_byte_order():
    turns = KeyTurns()
    turns.learn(_jobs("é", "z") + _jobs("a", priority=5) + _jobs("k", queue="r"))
    # "é" (U+00E9) sorts after "z" in byte order, as in the claim index (collation C).
    assert (turns.last("q", 0), turns.last("q", 5), turns.last("r", 0)) == ("é", "a", "k")
    assert turns.params(["r"]) == {"turn_queues": ["r"], "turn_priorities": [0], "turns": ["k"]}


def test_claims_are_plain_between_probes_until_a_queue_takes_a_keyed_job():
    now = [0.0]
    keyed = KeyedQueues(clock=lambda: now[0])
    assert keyed.plain(["a"]) is False  # the first claim looks for keys
    now[0] = KEYED_PROBE / 2
    assert keyed.plain(["a", "b"]) is True
    keyed.learn([_Job("a", 0, None), _Job("b", 0, None)])  # key-less jobs teach nothing
    assert keyed.plain(["a"]) is True
    now[0] = KEYED_PROBE
    assert keyed.plain(["a"]) is False  # the next probe
    assert keyed.plain(["a"]) is True
    keyed.learn([_Job("b", 0, "tenant-1")])
    assert keyed.plain(["a"]) is True and keyed.plain(["a", "b"]) is False
    now[0] += KEYED_PROBE / 2 + KEYED_FOR  # b's keyed job long ago; a probe done just now
    keyed.plain(["a"])
    assert keyed.plain(["a", "b"]) is True
