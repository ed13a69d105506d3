"""The dashboard's pages (GET): queues and the charts, the job list (and opening a job by its
id), one job, the dead letters, the periodic schedules, the sign-in form. Each reads through
what the API's endpoints use (`jobcore.search`, `jobcore.store`, the API's validation of list
parameters), on the API's engine and under its deadline."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from jobcore import pauses, search, store
from jobcore.catalog import MAX_AGE
from jobcore.ids import parse_id
from jobcore.queries import JOB_TYPE_LIST
from jobcore.queries.job_types import record_from_row
from jobcore.record import FailedAttempt
from jobcore.rows import Job, JobTypeRecord
from jobcore.states import Status
from jobqueue_api import jobs, validation
from jobqueue_api.database import REQUEST_DEADLINE, in_turn
from jobqueue_api.state import state_of
from jobqueue_api.ui import access, render
from jobqueue_api.ui import schedules as periodic_view
from jobqueue_api.ui.chart import STACK, chart, queue_hours

log = logging.getLogger("jobqueue.api")

# The chart's statement is given this long (the page's other reads take milliseconds); over
# it, the page shows the queues without the chart. About 50 ms per 100,000 jobs finished in
# the hour were measured (docs/api.md, "Dashboard").
CHART_BUDGET_MS = 1000
# PostgreSQL's SQLSTATE for a statement cancelled by statement_timeout.
QUERY_CANCELED = "57014"
# The page sizes the jobs form offers (the API takes any from 1 to 500).
PAGE_SIZES = (20, 50, 100, 500)
# What the dead letters page filters by (its status is fixed).
DEAD_LETTER_PARAMETERS = ("type", "queue", "limit", "cursor")
# How many dead letters one click of the bulk retry retries at most.
BULK_RETRY_LIMIT = 100
# A job page refreshes itself this often while the job is pending or processing.
JOB_REFRESH_SECONDS = 3
UNFINISHED = frozenset({Status.PENDING, Status.PROCESSING})


async def queues(request: Request) -> Response:
    engine = state_of(request.app).engine
    async with asyncio.timeout(REQUEST_DEADLINE), in_turn(engine), engine.connect() as conn:
        depths = await pauses.queues_with_pauses(conn)
        finished = await _within_budget(conn, search.JOB_COUNT_FINISHED_PER_MINUTE)
        hours = None if conn.invalidated else await _within_budget(conn, search.QUEUE_GET_HOUR)
    context = {
        "current": "queues",
        "queues": depths,
        "chart": None
        if finished is None
        else chart((row.minute, row.status, row.finished) for row in finished),
        "hours": None if hours is None else queue_hours(tuple(row) for row in hours),
        "chart_budget_ms": CHART_BUDGET_MS,
        "stack": [s.value for s in STACK],
    }
    return render.page(request, "queues.html", context)


async def _within_budget(conn: AsyncConnection, statement: Any) -> list[Any] | None:
    """A chart's rows, or None when counting them takes over CHART_BUDGET_MS: their range
    read grows with the hour's throughput, and the queue depths must still be shown. The
    budget is its transaction's own (`SET LOCAL`): the connection, once back in the pool,
    or through a pooler another client's, keeps none of it."""
    if conn.in_transaction():
        await conn.commit()  # the page's reads so far, on a connection that autocommits
    conn = await conn.execution_options(isolation_level="READ COMMITTED")
    try:
        async with conn.begin():
            await conn.execute(sa.text(f"SET LOCAL statement_timeout = {CHART_BUDGET_MS}"))
            return list((await conn.execute(statement)).all())
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) != QUERY_CANCELED:
            raise
        log.warning(
            "dashboard chart skipped: over its time budget",
            extra={"budget_ms": CHART_BUDGET_MS},
        )
        return None


def _given(request: Request) -> list[tuple[str, str]]:
    """The query parameters with a value: a form submits its empty fields too, meaning any."""
    return [(name, value) for name, value in request.query_params.multi_items() if value != ""]


async def list_page(request: Request, asked: validation.ListQuery) -> tuple[list[Job], UUID | None]:
    """A page of `GET /jobs` and the id to continue from (None on the last page)."""
    engine = state_of(request.app).engine
    async with asyncio.timeout(REQUEST_DEADLINE), in_turn(engine), engine.connect() as conn:
        return await search.list_jobs(conn, asked.filters, asked.limit, asked.before)


async def _list(request: Request, params: Mapping[str, str]) -> tuple[list[Job], str | None]:
    """The page for these query parameters (raises validation.InvalidRequest), and the cursor of
    the next page."""
    found, last = await list_page(request, validation.list_query(params))
    return found, validation.encode_cursor(last) if last is not None else None


async def known_types(request: Request) -> list[str]:
    """The types the type filter offers: this process's, JOB_TYPES and the workers' records
    (one read of the small `job_types` table)."""
    return sorted(
        state_of(request.app).types.current().types | {r.type for r in await recorded(request)}
    )


async def recorded(request: Request) -> list[JobTypeRecord]:
    """What the workers recorded in `job_types` within `catalog.MAX_AGE`, by type."""
    engine = state_of(request.app).engine
    async with asyncio.timeout(REQUEST_DEADLINE), in_turn(engine), engine.connect() as conn:
        rows = await conn.execute(JOB_TYPE_LIST, {"max_age": MAX_AGE})
        return [record_from_row(row._mapping) for row in rows]


async def jobs_page(request: Request) -> Response:
    given = _given(request)
    searched = dict(given).get("q")
    if searched is not None:
        return await _open_by_id(request, searched.strip())
    return await jobs_view(request, given)


async def jobs_view(
    request: Request, given: list[tuple[str, str]], *, notice: str | None = None
) -> Response:
    """The jobs page for these list parameters (and the answer of a bulk action)."""
    shown = dict(given)
    context: dict[str, Any] = {
        "current": "jobs",
        "filters": shown,
        "statuses": [s.value for s in Status],
        "page_sizes": PAGE_SIZES,
        "jobs": [],
        "next_cursor": None,
        "known_types": await known_types(request),
        "searched": "",
        "notice": notice,
    }
    try:
        params = validation.query(given, validation.LIST_PARAMETERS)
        context["jobs"], context["next_cursor"] = await _list(request, params)
    except validation.InvalidRequest as exc:
        return render.page(request, "jobs.html", {**context, "error": str(exc)}, 400)
    return render.page(request, "jobs.html", context)


async def _open_by_id(request: Request, searched: str) -> Response:
    """The search field `q`: the job's page (by a redirect, so its address is the job's), or
    a 404 page saying there is no such job, with the field to try again."""
    job = await _read_job(request, searched)
    if job is not None:
        return RedirectResponse(f"{access.root(request)}/jobs/{job.id}", status_code=303)
    context: dict[str, Any] = {
        "current": "jobs",
        "filters": {},
        "statuses": [s.value for s in Status],
        "page_sizes": PAGE_SIZES,
        "jobs": [],
        "next_cursor": None,
        "known_types": await known_types(request),
        "searched": searched,
        "error": f"There is no job {searched!r}"
        + ("." if parse_id(searched) is not None else ": a job id is a UUID."),
    }
    return render.page(request, "jobs.html", context, 404)


async def _read_job(request: Request, given: str) -> Job | None:
    job_id = parse_id(given)
    if job_id is None:
        return None
    engine = state_of(request.app).engine
    async with asyncio.timeout(REQUEST_DEADLINE), in_turn(engine), engine.connect() as conn:
        return await store.get(conn, job_id)


async def job_page(request: Request) -> Response:
    job = await _read_job(request, request.path_params["id"])
    if job is None:
        return render.error(request, 404, f"There is no job {request.path_params['id']!r}.")
    return job_view(request, job)


def durations(job: Job, now: datetime) -> list[tuple[str, float]]:
    """What the record tells of the job's time: how long it has run and waited while running
    (its attempt started at its last update: a claim sets it, heartbeats do not), and in
    all from creation to the end (or to now)."""
    shown = []
    if job.status is Status.PROCESSING and job.cancel_requested_at is None:
        shown.append(("Running for", (now - job.updated_at).total_seconds()))
        shown.append(
            ("Waited before this attempt", max((job.updated_at - job.run_at).total_seconds(), 0.0))
        )
    elif job.status is Status.PENDING and job.run_at <= now:
        shown.append(("Waiting for", (now - job.run_at).total_seconds()))
    end = job.finished_at or now
    shown.append(
        ("In all" if job.finished_at else "So far", (end - job.created_at).total_seconds())
    )
    return shown


def job_view(
    request: Request,
    job: Job,
    *,
    notice: str | None = None,
    error: str | None = None,
    status: int = 200,
) -> Response:
    context = {
        "current": "jobs",
        "job": job,
        "durations": durations(job, datetime.now(UTC)),
        "refresh_seconds": JOB_REFRESH_SECONDS if job.status in UNFINISHED else None,
        "can_retry": job.status in jobs.RETRYABLE,
        "can_cancel": job.status in jobs.CANCELLABLE,
        # Oldest first, as the API lists them; None when the job was read without them
        # (the answer of an action), and the page leaves the section out.
        "failed_attempts": (
            None if job.errors is None else [FailedAttempt.from_json(e) for e in job.errors]
        ),
        "notice": notice,
        "error": error,
    }
    return render.page(request, "job.html", context, status)


async def dead_letters(request: Request) -> Response:
    return await dead_letters_view(request, _given(request))


async def dead_letters_view(
    request: Request,
    given: list[tuple[str, str]],
    *,
    notice: str | None = None,
    error: str | None = None,
    status: int = 200,
) -> Response:
    """The dead letters page for these parameters (`type`, `queue`, `limit`, `cursor`)."""
    context: dict[str, Any] = {
        "current": "dead_letters",
        "filters": dict(given),
        "jobs": [],
        "next_cursor": None,
        "notice": notice,
        "error": error,
        "bulk_limit": BULK_RETRY_LIMIT,
        "known_types": await known_types(request),
    }
    try:
        params = validation.query(given, DEAD_LETTER_PARAMETERS)
        params["status"] = Status.DEAD_LETTER.value
        context["jobs"], context["next_cursor"] = await _list(request, params)
    except validation.InvalidRequest as exc:
        return render.page(request, "dead_letters.html", {**context, "error": str(exc)}, 400)
    return render.page(request, "dead_letters.html", context, status)


async def schedules_page(request: Request) -> Response:
    records = await recorded(request)
    engine = state_of(request.app).engine
    async with asyncio.timeout(REQUEST_DEADLINE), in_turn(engine), engine.connect() as conn:
        shown = await periodic_view.listed(conn, records, datetime.now(UTC))
    context = {"current": "schedules", "schedules": shown}
    return render.page(request, "schedules.html", context)


async def sign_in_page(request: Request) -> Response:
    if not access.tokens(request):
        return RedirectResponse(f"{access.root(request)}/", status_code=303)
    back = safe_next(request, request.query_params.get("next"))
    return render.page(request, "sign_in.html", {"next": back})


def safe_next(request: Request, wanted: str | None) -> str:
    """Where to go after signing in: a dashboard page of this site, never elsewhere."""
    root = access.root(request)
    home = f"{root}/"
    if not wanted or not wanted.startswith(home) or "\\" in wanted or "//" in wanted:
        return home
    if any(ord(ch) < 0x21 or ch == "\x7f" for ch in wanted):
        return home
    return wanted
