"""The list (`jobcore.search.list_jobs`) and the queue depths (`queue_depths`) against a real
PostgreSQL: exactly the matching jobs, newest first, every job once across keyset pages
(also while jobs are inserted and change status), and depths that count what they say."""

from __future__ import annotations

import asyncio
import itertools
import random
from dataclasses import dataclass
from uuid import UUID

import pytest
import sqlalchemy as sa

from jobcore import compiled, control, search, store
from jobcore.ids import new_id
from jobcore.rows import NewJob
from jobcore.schema import jobs
from jobcore.search import Filters
from jobcore.states import FINISHED, Operation, Status
from tests.jobcore.test_states import C, D, F, P, R, X
from tests.pg import driver

TYPES = ("a", "b", "c")
QUEUES = ("q1", "q2")


@dataclass(frozen=True)
class Row:
    id: UUID
    status: Status
    type: str
    queue: str

    def matches(self, filters: Filters) -> bool:
        return (
            (filters.statuses is None or self.status in filters.statuses)
            and filters.type in (None, self.type)
            and filters.queue in (None, self.queue)
        )


def _values(status: Status, type_: str, queue: str, **extra) -> dict:
    """A job row in `status`, with the columns that status requires."""
    return {
        "id": new_id(),
        "type": type_,
        "payload": {},
        "max_attempts": 3,
        "status": status.value,
        "queue": queue,
        "attempts": 0 if status is P else 1,
        "locked_until": sa.func.now() + sa.text("interval '5 minutes'") if status is R else None,
        "finished_at": sa.func.now() if status in FINISHED else None,
        **extra,
    }


async def _insert(engine, specs: list[tuple[Status, str, str]]) -> list[Row]:
    rows = []
    async with engine.begin() as conn:
        for status, type_, queue in specs:
            values = _values(status, type_, queue)
            await conn.execute(sa.insert(jobs).values(**values))
            rows.append(Row(values["id"], status, type_, queue))
    return rows


async def _every_kind(engine, per_kind: int = 2) -> list[Row]:
    """`per_kind` jobs of every (status, type, queue), inserted in a shuffled order."""
    specs = list(itertools.product(Status, TYPES, QUEUES)) * per_kind
    random.Random(7).shuffle(specs)
    return await _insert(engine, specs)


def _newest_first(rows: list[Row], filters: Filters) -> list[UUID]:
    return sorted((row.id for row in rows if row.matches(filters)), reverse=True)


async def _all_pages(engine, filters: Filters, limit: int) -> list[list[UUID]]:
    pages: list[list[UUID]] = []
    before = None
    while True:
        async with engine.connect() as conn:
            found, before = await search.list_jobs(conn, filters, limit, before)
        pages.append([job.id for job in found])
        if before is None:
            return pages
        assert before == found[-1].id
        assert len(pages) < 10_000, "paging does not end"


STATUS_CHOICES = {
    "any": None,
    **{s.value: [s] for s in Status},
    "pending,failed": [P, F],
    "processing,completed": [R, C],
    "all-six": list(Status),
}


@pytest.mark.parametrize("statuses", STATUS_CHOICES.values(), ids=STATUS_CHOICES.keys())
async def test_every_filter_combination_returns_exactly_the_matching_jobs_newest_first(
    engine, statuses
):
    rows = await _every_kind(engine)
    for type_, queue in itertools.product((None, "a", "absent"), (None, "q1", "absent")):
        filters = Filters(statuses=statuses, type=type_, queue=queue)
        async with engine.connect() as conn:
            found, cursor = await search.list_jobs(conn, filters, search.MAX_LIMIT, None)
        expected = _newest_first(rows, filters)
        assert [job.id for job in found] == expected, filters
        assert cursor is None
        for job in found:  # the records are the jobs' own
            row = next(r for r in rows if r.id == job.id)
            assert (job.status, job.type, job.queue) == (row.status, row.type, row.queue)


@pytest.mark.parametrize("limit", [1, 3, 7, 50])
async def test_paging_with_small_limits_visits_every_job_once_in_order(engine, limit):
    rows = await _every_kind(engine)
    for filters in (
        Filters(),
        Filters(statuses=[C]),
        Filters(statuses=[P, R, D]),
        Filters(type="b"),
        Filters(queue="q2"),
        Filters(statuses=[F, X], type="c", queue="q1"),
    ):
        pages = await _all_pages(engine, filters, limit)
        expected = _newest_first(rows, filters)
        assert [job_id for page in pages for job_id in page] == expected, filters
        # Full pages but the last; no empty page after a cursor.
        assert all(len(page) == limit for page in pages[:-1]), filters
        assert pages[-1] or len(pages) == 1, filters


async def test_a_page_of_nothing_has_no_cursor(engine):
    await _every_kind(engine, per_kind=1)
    async with engine.connect() as conn:
        found, cursor = await search.list_jobs(conn, Filters(type="absent"), 10, None)
        assert (found, cursor) == ([], None)
        # A cursor below every job: an empty last page.
        found, cursor = await search.list_jobs(conn, Filters(), 10, UUID(int=0))
        assert (found, cursor) == ([], None)


# --- paging while jobs change ---------------------------------------------------------


class Mutator:
    """Inserts jobs and moves existing ones through their transitions, as the API and the
    worker do, until told to stop; remembers every job it touched."""

    def __init__(self, engine, rows: list[Row]) -> None:
        self.engine = engine
        self.rng = random.Random(11)
        self.rows = rows
        self.touched: set[UUID] = set()
        self.inserted: set[UUID] = set()
        self.rounds = 0
        self.stop = asyncio.Event()
        self.advanced = asyncio.Event()  # set after each round

    async def run(self) -> None:
        while not self.stop.is_set():
            await self.round()
            self.rounds += 1
            self.advanced.set()

    async def round(self) -> None:
        rng = self.rng
        specs = [(P, rng.choice(TYPES), rng.choice(QUEUES)) for _ in range(2)]
        self.inserted |= {row.id for row in await _insert(self.engine, specs)}
        async with self.engine.connect() as conn:
            raw = await driver(conn)
            claimed = await compiled.claim(raw, {rng.choice(QUEUES): 2}, 60)
            self.touched |= {job.id for job in claimed}
            await compiled.record(raw, Operation.COMPLETE, [job.lease for job in claimed[:1]])
        # An operator retries a finished job and cancels a pending one, chosen at random
        # (the choice counts as touched whether or not the status allowed it).
        for action in (control.manual_retry, control.cancel):
            job_id = rng.choice(self.rows).id
            self.touched.add(job_id)
            async with self.engine.begin() as conn:
                await action(conn, job_id)


PAGE = 3


@pytest.mark.parametrize(
    "filters",
    [Filters(), Filters(statuses=[P, F, X]), Filters(queue="q1"), Filters(statuses=[C], type="a")],
    ids=["any", "pending,failed,cancelled", "queue", "completed-type"],
)
async def test_keyset_paging_while_jobs_are_inserted_and_change_status(engine, filters):
    """No job is repeated, and every job that matched before paging began and that nothing
    touched meanwhile is seen."""
    rows = await _every_kind(engine, per_kind=6)
    before_paging = set(_newest_first(rows, filters))
    mutator = Mutator(engine, rows)
    task = asyncio.create_task(mutator.run())
    seen: list[UUID] = []
    pages = 0
    try:
        cursor = None
        while True:
            async with engine.connect() as conn:
                found, cursor = await search.list_jobs(conn, filters, PAGE, cursor)
            pages += 1
            for job in found:
                assert job.status in (filters.statuses or Status)
                assert filters.type in (None, job.type) and filters.queue in (None, job.queue)
            seen += [job.id for job in found]
            if cursor is None:
                break
            # Let the changes land between pages too, not only at random points.
            mutator.advanced.clear()
            await asyncio.wait_for(mutator.advanced.wait(), 30)
    finally:
        mutator.stop.set()
        await task
    assert pages >= 4 and mutator.rounds >= pages - 1
    assert len(seen) == len(set(seen)), "a job was repeated"
    assert seen == sorted(seen, reverse=True), "pages are not newest first"
    assert before_paging - mutator.touched <= set(seen)
    # Jobs inserted after paging began are newer than its first page: never on later pages.
    assert not (mutator.inserted & set(seen[PAGE:]))


# --- queue depths ---------------------------------------------------------------------


async def _depths(engine) -> dict[str, search.QueueDepth]:
    """By queue, through the API's call; the worker's compiled call must agree."""
    async with engine.connect() as conn:
        api = await search.queue_depths(conn)
        worker = await compiled.queue_depths(await driver(conn))
    assert [d.queue for d in api] == sorted(d.queue for d in api)
    assert [(d.queue, *_counts(d)) for d in api] == [(d.queue, *_counts(d)) for d in worker]
    return {depth.queue: depth for depth in api}


def _counts(depth: search.QueueDepth) -> tuple[int, int, int, int]:
    return (depth.pending, depth.scheduled, depth.processing, depth.dead_letter)


async def _add(engine, status: Status, queue: str, n: int = 1, run_at: str | None = None):
    async with engine.begin() as conn:
        for _ in range(n):
            extra = {"run_at": sa.func.now() + sa.text(f"interval '{run_at}'")} if run_at else {}
            await conn.execute(sa.insert(jobs).values(**_values(status, "a", queue, **extra)))


async def test_queue_depths_count_due_and_scheduled_pending_processing_and_dead_letters(engine):
    await _add(engine, P, "mail", 3, run_at="-100 seconds")
    await _add(engine, P, "mail", 1, run_at="-5 seconds")
    await _add(engine, P, "mail", 2, run_at="1 hour")
    await _add(engine, R, "mail", 4)
    await _add(engine, D, "mail", 5)
    await _add(engine, P, "bulk", 1, run_at="2 hours")
    await _add(engine, D, "bulk", 1)
    # A queue whose only jobs are running is found among the leased rows.
    await _add(engine, R, "busy", 2)
    depths = await _depths(engine)
    assert list(depths) == ["bulk", "busy", "mail"]
    mail = depths["mail"]
    assert _counts(mail) == (4, 2, 4, 5)
    # The oldest due job has waited since its run_at, 100 s ago (measured on the database
    # clock a moment later).
    assert 100 <= mail.oldest_pending_age_seconds < 130
    bulk = depths["bulk"]
    assert _counts(bulk) == (0, 1, 0, 1)
    assert bulk.oldest_pending_age_seconds == 0  # nothing due
    busy = depths["busy"]
    assert _counts(busy) == (0, 0, 2, 0)


async def test_queue_depths_never_count_finished_jobs(engine):
    await _add(engine, P, "mail", 2, run_at="-1 minute")
    await _add(engine, D, "mail", 1)
    before = await _depths(engine)
    for status in (C, F, X):
        await _add(engine, status, "mail", 3, run_at="-2 hours")
        await _add(engine, status, "mail", 3, run_at="2 hours")
        await _add(engine, status, "done", 3)
    after = await _depths(engine)
    assert _counts(after["mail"]) == _counts(before["mail"]) == (2, 0, 0, 1)
    assert after["mail"].oldest_pending_age_seconds >= before["mail"].oldest_pending_age_seconds
    # A queue that holds finished jobs only is listed, with nothing to count.
    done = after["done"]
    assert _counts(done) == (0, 0, 0, 0)
    assert done.oldest_pending_age_seconds == 0


async def test_queue_depths_of_an_empty_table_are_empty(engine):
    assert await _depths(engine) == {}


async def test_queue_depths_follow_a_claim_and_its_completion(engine):
    await _add(engine, P, "mail", 3, run_at="-1 second")
    async with engine.connect() as conn:
        raw = await driver(conn)
        claimed = await compiled.claim(raw, {"mail": 2}, 60)
        mid = (await _depths(engine))["mail"]
        assert _counts(mid) == (1, 0, 2, 0)
        await compiled.record(raw, Operation.COMPLETE, [job.lease for job in claimed])
    assert _counts((await _depths(engine))["mail"]) == (1, 0, 0, 0)


async def test_a_submitted_job_is_listed_first(engine):
    await _every_kind(engine, per_kind=1)
    async with engine.begin() as conn:
        job, _ = await store.submit(conn, NewJob(new_id(), "a", {}, 3, queue="q1"))
    async with engine.connect() as conn:
        for filters in (Filters(), Filters(statuses=[P]), Filters(type="a", queue="q1")):
            found, _ = await search.list_jobs(conn, filters, 1, None)
            assert [j.id for j in found] == [job.id], filters
