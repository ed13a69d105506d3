"""The API's cache of the types the workers recorded: a request naming a type it lacks reads
the table, and a read that began before the request cannot make it miss a record."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from jobcore.rows import JobTypeRecord
from jobqueue_api import catalog


def _record(job_type: str) -> JobTypeRecord:
    return JobTypeRecord(job_type, {"queue": "mail"}, [], "host:1", datetime.now(UTC))


class Table:
    """`job_types` as successive reads see it: each read takes its snapshot when it begins,
    and the first one is held until released."""

    def __init__(self) -> None:
        self.rows: list[JobTypeRecord] = []
        self.reads = 0
        self.release_first = asyncio.Event()

    async def read(self, engine: Any, call: Any, retry: bool = False) -> list[JobTypeRecord]:
        snapshot = list(self.rows)
        self.reads += 1
        if self.reads == 1:
            await self.release_first.wait()
        return snapshot


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Table:
    table = Table()
    monkeypatch.setattr(catalog, "on_driver", table.read)
    return table


async def test_a_miss_does_not_settle_for_a_read_that_began_before_it(table: Table) -> None:
    types = catalog.TypeCatalog(engine=None, refresh=0.0)  # type: ignore[arg-type]
    await types.known(["sleep"])  # starts a background read, held
    await asyncio.sleep(0)
    table.rows.append(_record("report"))  # a worker records the type meanwhile
    asking = asyncio.create_task(types.known(["report"]))
    await asyncio.sleep(0.01)
    table.release_first.set()  # the old read answers without the record
    found = await asyncio.wait_for(asking, 5)
    assert "report" in found.types
    assert table.reads == 2


async def test_a_miss_reads_once_when_no_read_is_in_flight(table: Table) -> None:
    table.release_first.set()
    types = catalog.TypeCatalog(engine=None)  # type: ignore[arg-type]
    table.rows.append(_record("report"))
    assert "report" in (await types.known(["report"])).types
    assert "nope" not in (await types.known(["nope"])).types
    assert table.reads == 2
