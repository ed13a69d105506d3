"""Jobs in any status, written straight to the table (the dashboard shows what is there;
how jobs got there is other tests' business), and reading the dashboard's HTML."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore.ids import new_id
from jobcore.schema import jobs
from jobcore.states import FINISHED, Status


def job_rows(
    count: int = 1,
    *,
    status: str = "pending",
    queue: str = "default",
    type: str = "sleep",
    payload: Any = None,
    last_error: str | None = None,
    result: Any = None,
    errors: list[dict[str, Any]] | None = None,
    attempts: int | None = None,
    scheduled: bool = False,
    finished_minutes_ago: float = 0.0,
) -> list[dict[str, Any]]:
    """Rows for `count` jobs in `status` (ids: `new_id()`, so newest first is id order)."""
    finished = Status(status) in FINISHED
    return [
        {
            "id": new_id(),
            "type": type,
            "payload": {} if payload is None else payload,
            "status": status,
            "attempts": (3 if finished else 0) if attempts is None else attempts,
            "max_attempts": 3,
            "queue": queue,
            "last_error": last_error,
            "result": result,
            "errors": errors,
            "run_at": sa.func.now() + sa.text("interval '1 hour'") if scheduled else sa.func.now(),
            "locked_until": sa.func.now() + sa.text("interval '5 minutes'")
            if status == "processing"
            else None,
            "finished_at": sa.func.now() - sa.text(f"interval '{finished_minutes_ago} minutes'")
            if finished
            else None,
        }
        for _ in range(count)
    ]


async def add_jobs(engine: AsyncEngine, count: int = 1, **fields: Any) -> list[UUID]:
    """Write `job_rows(count, **fields)`; their ids."""
    rows = job_rows(count, **fields)
    if rows:
        async with engine.begin() as conn:
            await conn.execute(jobs.insert().values(rows))
    return [row["id"] for row in rows]


def add_jobs_sync(engine: sa.Engine, count: int = 1, **fields: Any) -> list[UUID]:
    """`add_jobs` on a synchronous engine (for tests that cannot run an event loop)."""
    rows = job_rows(count, **fields)
    if rows:
        with engine.begin() as conn:
            conn.execute(jobs.insert().values(rows))
    return [row["id"] for row in rows]


class _Tables(HTMLParser):
    """Every table's rows as lists of cell texts, and the page's links and forms."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.links: list[tuple[str, str]] = []
        self._cell: list[str] | None = None
        self._link: list[str] | None = None
        self._href = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th") and self.tables:
            self._cell = []
        elif tag == "a":
            self._link, self._href = [], dict(attrs).get("href") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "a" and self._link is not None:
            self.links.append((" ".join("".join(self._link).split()), self._href))
            self._link = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._link is not None:
            self._link.append(data)


def parse(html: str) -> _Tables:
    parser = _Tables()
    parser.feed(html)
    return parser


def table(html: str, index: int = 0) -> list[list[str]]:
    """The rows (cell texts) of the page's `index`th table, header row first."""
    return parse(html).tables[index]


def links(html: str) -> list[tuple[str, str]]:
    """(text, href) of every link on the page."""
    return parse(html).links


_CSRF = re.compile(r'<meta name="csrf-token" content="([0-9a-f]+)">')


def csrf_of(html: str) -> str:
    found = _CSRF.search(html)
    assert found, "no CSRF token on the page"
    return found.group(1)


def altered(signed: str) -> str:
    """A signed value (a session, a CSRF token) with its last digit changed: never still valid."""
    return signed[:-1] + ("1" if signed[-1] == "0" else "0")
