"""Count floors (`jobcore.floors.CountFloors`): the periodic counts (the worker's queue
gauges, the API's admission) read from where the live jobs began at their last count, so
under a held MVCC horizon they step over none of the dead entries the queue leaves, and a
sweep from the head now and then finds what appeared below them."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from jobcore import compiled, search, store
from jobcore.floors import COUNT_SWEEP_INTERVAL, Counted, CountFloors
from jobcore.queries import JOB_COUNT_PENDING
from jobcore.runner import Compiled
from tests.jobcore.test_floors import insert
from tests.pg import driver, entries_read

MARGIN = 1_000_000  # the default margin, in microseconds


# --- the bookkeeping ----------------------------------------------------------------------


def test_a_sweep_sends_no_floors():
    floors = CountFloors()
    floors.learn([Counted("default", [0], [5 * MARGIN], 9 * MARGIN)], sweep=True)
    assert floors.params(sweep=True) == dict(search.FROM_THE_HEAD)
    assert floors.params(sweep=False) == {
        "known_queues": ["default"],
        "floor_queues": ["default"],
        "floor_priorities": [0],
        "floors": [4 * MARGIN],
        "lease_floor": 8 * MARGIN,
    }
    assert "lease_floor" not in floors.params(sweep=False, leases=False)


def test_after_a_count_the_floors_only_rise_and_what_it_found_in_the_gaps_is_added():
    floors = CountFloors()
    floors.learn([Counted("b", [0], [5 * MARGIN], 9 * MARGIN)], sweep=True)
    floors.learn(
        [
            Counted("a", [3], [7 * MARGIN], 6 * MARGIN),
            Counted("b", [1, 0], [2 * MARGIN, 3 * MARGIN], 9 * MARGIN),
        ],
        sweep=False,
    )
    params = floors.params(sweep=False)
    assert params["known_queues"] == ["a", "b"]
    found = zip(params["floor_queues"], params["floor_priorities"], params["floors"], strict=True)
    assert list(found) == [
        ("a", 3, 6 * MARGIN),
        ("b", 0, 4 * MARGIN),  # not lowered to 2 s
        ("b", 1, 1 * MARGIN),
    ]
    assert params["lease_floor"] == 8 * MARGIN  # the earliest lease (5 s) would lower it


def test_a_sweep_forgets_the_queues_and_priorities_it_did_not_find():
    floors = CountFloors()
    floors.learn([Counted("a", [0, -1], [5 * MARGIN, 5 * MARGIN], 5 * MARGIN)], sweep=False)
    floors.learn([Counted("b", [2], [9 * MARGIN], 3 * MARGIN)], sweep=True)
    params = floors.params(sweep=False)
    assert (params["known_queues"], params["floor_priorities"]) == (["b"], [2])
    assert params["lease_floor"] == 2 * MARGIN  # a sweep's lease floor may fall


def test_a_count_without_leases_leaves_the_lease_floor_alone():
    floors = CountFloors()
    floors.learn([Counted("a", [0], [5 * MARGIN])], sweep=True)
    assert floors.params(sweep=False)["lease_floor"] is None


def test_counts_sweep_while_cheap_and_at_least_every_30_s_when_not():
    floors = CountFloors()
    assert floors.sweeps.due(0.0)
    floors.sweeps.done(0.0, 0.002)
    assert not floors.sweeps.due(0.03) and floors.sweeps.due(0.05)
    floors.sweeps.done(100.0, 103.0)  # a sweep under a held horizon
    assert not floors.sweeps.due(103.0 + COUNT_SWEEP_INTERVAL - 1)
    assert floors.sweeps.due(103.0 + COUNT_SWEEP_INTERVAL)


# --- on PostgreSQL ------------------------------------------------------------------------


async def _run(engine, statement: str, where: str = "TRUE") -> None:
    async with engine.begin() as conn:
        await conn.execute(sa.text(f"UPDATE jobqueue.jobs SET {statement} WHERE {where}"))


_CLAIMED = "status = 'processing', attempts = 1, lease_token = 1"


async def _depths(engine, floors: CountFloors, *, sweep: bool) -> dict[str, search.QueueDepth]:
    async with engine.connect() as conn:
        depths = await compiled.queue_depths(await driver(conn), floors, sweep)
        await conn.commit()
    return {depth.queue: depth for depth in depths}


def _counts(depths: dict[str, search.QueueDepth]) -> dict[str, tuple[int, ...]]:
    """The depths without the age of the oldest due job, which grows as the test runs."""
    return {q: (d.pending, d.scheduled, d.processing, d.dead_letter) for q, d in depths.items()}


async def _pending(engine, floors: CountFloors, *, sweep: bool, caps: dict[str, int]) -> Any:
    async with engine.connect() as conn:
        found, counted = await store.pending_depths(conn, caps, 1000, floors, sweep)
        await conn.commit()
    floors.learn(counted, sweep=sweep)
    return found


async def _entries(engine, statement: Any, params: dict[str, Any], index: str) -> int:
    sql = Compiled(statement)

    async def count(raw: Any) -> None:
        await raw.fetch(sql.sql, *sql.args(params))

    return await entries_read(engine, f"jobqueue.{index}", count)


# The indexes a count may read, by what it finds there (the planner picks the claim index).
_INDEXES = {
    "pending": ("jobs_claim_queue_idx", "jobs_claim_key_idx"),
    "leases": ("jobs_lease_idx",),
    "queues": ("jobs_queue_idx",),
}
_HEAD_PENDING = CountFloors().params(sweep=True, leases=False)


async def test_under_a_held_horizon_floored_counts_step_over_no_dead_entry(engine):
    """3,000 jobs of queue `a` ran while a transaction holds the horizon, and left: their
    pending, leased and finished entries stay, dead, in every index the counts read. Read
    from the head, the gauges and admission visit each one; from their floors, next to
    none, and they count the same."""
    async with engine.connect() as holder:
        await holder.execute(sa.text("SELECT txid_current()"))  # held until the block ends
        await insert(
            engine, 3000, queue="a", run_at="now() - interval '302 s' + i * interval '100 ms'"
        )
        await _run(engine, f"{_CLAIMED}, locked_until = run_at")
        await _run(engine, "status = 'completed', locked_until = NULL, finished_at = now()")
        async with engine.begin() as conn:  # moved to the history
            await conn.execute(sa.text("DELETE FROM jobqueue.jobs"))
        await insert(engine, 5, queue="a")
        await insert(engine, 3, queue="b", priority=2)
        await insert(engine, 2, queue="a", priority=1)
        await _run(engine, f"{_CLAIMED}, locked_until = now() + interval '30 s'", "priority = 1")
        gauges, admission = CountFloors(), CountFloors()
        swept = await _depths(engine, gauges, sweep=True)
        await _pending(engine, admission, sweep=True, caps={"a": 100})
        await insert(engine, 4, queue="a")
        await insert(engine, 1, queue="c")  # a queue past the known ones

        floored = await _depths(engine, gauges, sweep=False)
        assert _counts(floored) == _counts(await _depths(engine, CountFloors(), sweep=True))
        assert (floored["a"].pending, floored["a"].processing) == (9, 2)
        assert (swept["b"].pending, floored["b"].pending, floored["c"].pending) == (3, 3, 1)
        assert await _pending(engine, admission, sweep=False, caps={"a": 100}) == {
            "a": 9,
            "b": 3,
            "c": 1,
        }

        caps = {"queues": ["a"], "caps": [100], "others": 1000}
        counts = {
            "gauges": (search.QUEUE_GET_DEPTHS, {}, dict(search.FROM_THE_HEAD), gauges),
            "admission": (JOB_COUNT_PENDING, caps, _HEAD_PENDING, admission),
        }
        reads = {}
        for name, (statement, fixed, head, floors) in counts.items():
            where = floors.params(sweep=False, leases=name == "gauges")
            for group, indexes in _INDEXES.items():
                reads[name, group] = [
                    sum([await _entries(engine, statement, {**fixed, **p}, i) for i in indexes])
                    for p in (head, where)
                ]
        await holder.rollback()
    # Admission counts no running jobs, and finds its queues among the pending ones.
    del reads["admission", "leases"], reads["admission", "queues"]
    for head, floor in reads.values():
        assert head > 3000 and floor < 40, reads  # the dead entries are there: it can tell


async def test_a_job_below_a_count_floor_is_counted_from_the_next_sweep(engine):
    """A job handed back or recovered keeps its `run_at`, and a late commit can land below
    a floor: the counts between sweeps miss it, the next sweep counts it."""
    floors = CountFloors()
    await insert(engine, 1, queue="a")
    await _depths(engine, floors, sweep=True)
    await insert(engine, 1, queue="a", run_at="now() - interval '1 hour'")
    assert (await _depths(engine, floors, sweep=False))["a"].pending == 1
    assert (await _depths(engine, floors, sweep=True))["a"].pending == 2
    assert (await _depths(engine, floors, sweep=False))["a"].pending == 2


async def test_counts_find_new_queues_and_priorities_in_the_gaps_and_keep_emptied_queues(
    engine,
):
    floors = CountFloors()
    await insert(engine, 1, queue="b", priority=0)
    await insert(engine, 1, queue="d", priority=0)
    await _depths(engine, floors, sweep=True)
    for queue in ("a", "c", "e"):
        await insert(engine, 1, queue=queue)
    for priority in (5, -5):
        await insert(engine, 1, queue="b", priority=priority)
    async with engine.begin() as conn:
        await conn.execute(sa.text("DELETE FROM jobqueue.jobs WHERE queue = 'd'"))
    depths = await _depths(engine, floors, sweep=False)
    assert {queue: depth.pending for queue, depth in depths.items()} == {
        "a": 1,
        "b": 3,
        "c": 1,
        "d": 0,  # until a sweep: nothing was read to find it empty
        "e": 1,
    }
    assert "d" not in await _depths(engine, floors, sweep=True)


async def test_a_scheduled_job_sets_no_floor_above_the_count(engine):
    """A queue holding only jobs due later gets a floor at the count's time, not at their
    `run_at`: a job submitted due now still lies above it."""
    floors = CountFloors()
    await insert(engine, 1, queue="a", run_at="now() + interval '1 hour'")
    await _depths(engine, floors, sweep=True)
    await insert(engine, 1, queue="a")
    depth = (await _depths(engine, floors, sweep=False))["a"]
    assert (depth.pending, depth.scheduled) == (1, 1)


async def test_admission_reads_at_most_its_cap_of_pending_jobs_whatever_the_priorities(engine):
    for priority in (0, 5, 10):
        await insert(engine, 50, queue="a", priority=priority)
    caps = {"queues": ["a"], "caps": [20], "others": None}
    read = await _entries(
        engine, JOB_COUNT_PENDING, {**caps, **_HEAD_PENDING}, _INDEXES["pending"][0]
    )
    read += await _entries(
        engine, JOB_COUNT_PENDING, {**caps, **_HEAD_PENDING}, _INDEXES["pending"][1]
    )
    assert await _pending(engine, CountFloors(), sweep=True, caps={"a": 20}) == {"a": 20}
    # The cap's entries, a probe per priority for its floor and one to find each priority.
    assert read <= 20 + 2 * 3 + 1, read
