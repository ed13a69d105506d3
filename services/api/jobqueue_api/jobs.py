"""The `/jobs` endpoints for one job or one submission: thin HTTP over `jobcore.store` and
`jobcore.control` (create, read and wait, status, retry, cancel).

`submit()` is the one path by which the API creates jobs; the routes only
parse, call jobcore, and shape JSON (`records`). Submits and the read of one job run
`jobcore.queries`' statements compiled, on asyncpg (`calls`, `database.on_driver`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from functools import partial
from typing import Any, TypeVar
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from jobcore import control, logs, store
from jobcore.errors import IdempotencyConflict
from jobcore.ids import parse_id
from jobcore.rows import Job, NewJob, Submitted
from jobcore.runner import Driver
from jobcore.states import Operation, Status
from jobqueue_api import calls, metrics, validation
from jobqueue_api.admission import REFRESH, Admission
from jobqueue_api.database import REQUEST_DEADLINE, in_turn, on_driver
from jobqueue_api.errors import error_response
from jobqueue_api.groups import SubmitGroups
from jobqueue_api.notify import Notifier
from jobqueue_api.records import JSONBody, job_json, record_json, status_json
from jobqueue_api.state import AppState, state_of
from jobqueue_api.tracing import submitting

log = logging.getLogger("jobqueue.api")
_NO_FIELDS = logs.Fields()


def _within(deadline: float | None) -> asyncio.Timeout:
    """The request's database deadline: REQUEST_DEADLINE from now, or an earlier start's."""
    return asyncio.timeout(REQUEST_DEADLINE) if deadline is None else asyncio.timeout_at(deadline)


async def submit(
    groups: SubmitGroups, new: NewJob, deadline: float | None = None
) -> tuple[Job, bool]:
    """Create `new`, or find the job its idempotency key already names: (job, created).

    Raises IdempotencyConflict, TimeoutError past `deadline` (REQUEST_DEADLINE from now by
    default), or the database's error. The job exists once this returns (committed). A
    submit without a key may share its statement with concurrent ones (`groups`).
    """
    if deadline is None:
        deadline = asyncio.get_running_loop().time() + REQUEST_DEADLINE
    job, created = await groups.submit(new, deadline)
    if created:
        metrics.SUBMITTED.inc()
    logs.line(
        log,
        "job submitted" if created else "job replayed",
        _NO_FIELDS,
        {"job_id": str(job.id), "job_type": job.type},
    )
    return job, created


async def submit_many(
    engine: AsyncEngine,
    notifier: Notifier,
    batch: list[NewJob],
    deadline: float | None = None,
) -> list[Submitted]:
    """Create every job of `batch` in one statement (and read its replays in a second);
    per-item results in input order."""
    async with _within(deadline):
        # Not retried: a batch that may have been written cannot be told apart from one
        # that was not (a connection known dead is replaced at checkout).
        results = await on_driver(
            engine, lambda conn, again: calls.submit_many(conn, batch), retry=False
        )
    created = sum(1 for r in results if r.result == "created")
    if created:
        notifier.jobs_due()
        metrics.SUBMITTED.inc(created)
    log.info("jobs submitted", extra={"jobs": len(batch), "jobs_created": created})
    return results


def _job_id(request: Request) -> UUID | None:
    return parse_id(request.path_params["id"])


def _not_found(request: Request) -> Response:
    return error_response(404, f"job {request.path_params['id']!r} not found")


async def create_job(request: Request) -> Response:
    """POST /jobs through Starlette's router; the app serves it ahead of the router
    (`hot.HotRoute`), with the same `submit_one`."""
    return await submit_one(state_of(request.app), request.headers.raw, await request.body())


async def submit_one(
    state: AppState, headers: Sequence[tuple[bytes, bytes]], body: bytes
) -> Response:
    """POST /jobs: validate the request (`headers`, `body`), admit it, submit it, answer."""
    settings = state.settings
    try:
        key = validation.idempotency_key(
            [value.decode("latin-1") for name, value in headers if name == b"idempotency-key"]
        )
        item = validation.parse_json(body)
        known = await state.types.known([item.get("type") if isinstance(item, dict) else None])
        new = validation.new_job(
            item,
            known_types=known.types,
            default_max_attempts=settings.max_attempts,
            idempotency_key=key,
            options=known.options,
        )
    except validation.InvalidRequest as exc:
        return error_response(400, str(exc))
    admission = state.admission
    deadline = None
    reservation = None
    if admission is not None:
        # The depth check and the insert share one deadline: a 503 still comes in time.
        deadline = asyncio.get_running_loop().time() + REQUEST_DEADLINE
        admitted = await admission.admit(state.engine, (new,), deadline)
        if isinstance(admitted, str):
            return _refused(admission, admitted)
        reservation = admitted
    # Unless the answer says otherwise the job may exist: a submit that timed out or lost its
    # connection may still commit, so its place counts until the next read of the depths.
    created = True
    try:
        with submitting(state.tracer, (new,)) as (new,):
            job, created = await submit(state.groups, new, deadline)
    except IdempotencyConflict as exc:
        created = False
        return error_response(409, str(exc))
    finally:
        if reservation is not None:
            reservation.done([new.queue] if created else [])
    if created:
        return JSONBody(job_json(job), status_code=201, headers={"Location": f"/jobs/{job.id}"})
    return JSONBody(job_json(job), status_code=200)


async def create_many(request: Request) -> Response:
    """POST /jobs/batch: all items valid or nothing written; one statement for all."""
    state = state_of(request.app)
    settings = state.settings
    try:
        body = validation.parse_json(await request.body())
        known = await state.types.known(_batch_types(body))
        batch = validation.new_many(
            body,
            known_types=known.types,
            default_max_attempts=settings.max_attempts,
            options=known.options,
        )
    except validation.InvalidRequest as exc:
        return error_response(400, str(exc))
    engine = state.engine
    admission = state.admission
    deadline = None
    reservation = None
    if admission is not None:
        deadline = asyncio.get_running_loop().time() + REQUEST_DEADLINE
        admitted = await admission.admit(engine, batch, deadline)
        if isinstance(admitted, str):
            return _refused(admission, admitted)
        reservation = admitted
    results: list[Submitted] | None = None
    try:
        with submitting(state.tracer, batch) as traced:
            results = await submit_many(engine, state.notifier, traced, deadline)
    finally:
        if reservation is not None:
            if results is None:  # no answer: every job may have been written
                reservation.done(new.queue for new in batch)
            else:
                pairs = zip(results, batch, strict=True)
                reservation.done(new.queue for result, new in pairs if result.result == "created")
    pairs = zip(results, batch, strict=True)
    return JSONBody({"results": [_many_result(result, new) for result, new in pairs]})


def _batch_types(body: Any) -> list[Any]:
    """The types a batch body names, as far as it has the shape to name any."""
    items = body.get("jobs") if isinstance(body, dict) else None
    if not isinstance(items, list):
        return []
    return [item.get("type") for item in items if isinstance(item, dict)]


def _refused(admission: Admission, queue: str) -> Response:
    """429 for a request that would add to `queue`, which holds its cap of pending jobs."""
    return error_response(
        429,
        f"queue {queue!r} holds {admission.cap(queue)} or more pending jobs (MAX_PENDING); "
        "nothing was written, retry later",
        {"Retry-After": f"{REFRESH:.0f}"},
    )


def _many_result(result: Submitted, new: NewJob) -> dict[str, Any]:
    if result.job_id is None:
        return {
            "status": result.result,
            "error": str(IdempotencyConflict(new.idempotency_key or "")),
        }
    return {"status": result.result, "id": str(result.job_id)}


async def _read(request: Request) -> Job | None:
    job_id = _job_id(request)
    if job_id is None:
        return None
    async with asyncio.timeout(REQUEST_DEADLINE):
        return await on_driver(state_of(request.app).engine, partial(_get, job_id), retry=True)


async def _get(job_id: UUID, conn: Driver, again: bool) -> Job | None:
    return await calls.get(conn, job_id)


async def get_job(request: Request) -> Response:
    """GET /jobs/{id}, and with `?wait=` once the job has finished or the wait has ended."""
    try:
        params = validation.query(request.query_params.multi_items(), ("wait",))
        seconds = validation.wait(params["wait"]) if "wait" in params else None
    except validation.InvalidRequest as exc:
        return error_response(400, str(exc))
    if seconds is None:
        job = await _read(request)
    else:
        job_id = _job_id(request)
        state = state_of(request.app)
        job = None
        if job_id is not None:
            job = await _unless_disconnected(
                request, state.waiters.wait(state.engine, job_id, seconds)
            )
    if job is None:
        return _not_found(request)
    return JSONBody(record_json(job))


_T = TypeVar("_T")


async def _unless_disconnected(request: Request, work: Awaitable[_T]) -> _T:
    """`work`'s result, or ClientDisconnect as soon as the client goes away (a waiter whose
    client left stops waiting, and its connection is freed at once)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    done = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnected())
    # Whatever ended the disconnect watch (a receive error too) only means: stop watching.
    gone.add_done_callback(lambda task: task.cancelled() or task.exception())
    try:
        await asyncio.wait((done, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not done.done():
            done.cancel()
    if done.done() and not done.cancelled():
        return done.result()
    raise ClientDisconnect


async def get_status(request: Request) -> Response:
    job = await _read(request)
    if job is None:
        return _not_found(request)
    return JSONBody(status_json(job))


# The statuses an operator's retry and cancel start from (the dashboard offers them there).
RETRYABLE: frozenset[Status] = Operation.MANUAL_RETRY.sources
CANCELLABLE: frozenset[Status] = Operation.CANCEL.sources | Operation.REQUEST_CANCEL.sources


async def retry(engine: AsyncEngine, notifier: Notifier, job_id: UUID) -> tuple[Job, bool] | None:
    """An operator's retry (`POST /jobs/{id}/retry`, the dashboard's Retry): the job and
    whether it was retried (else it is shown as it is); None if there is no such job."""
    async with asyncio.timeout(REQUEST_DEADLINE), in_turn(engine), engine.connect() as conn:
        job = await control.manual_retry(conn, job_id)
        current = None if job is not None else await store.get(conn, job_id)
    if job is not None:
        notifier.jobs_due()
        log.info("manual_retry", extra={"job_id": str(job.id), "job_type": job.type})
        return job, True
    return None if current is None else (current, False)


async def cancel(engine: AsyncEngine, job_id: UUID) -> tuple[Job, control.Cancelled] | None:
    """An operator's cancel (`POST /jobs/{id}/cancel`, the dashboard's Cancel); None if
    there is no such job."""
    async with asyncio.timeout(REQUEST_DEADLINE), in_turn(engine), engine.connect() as conn:
        done = await control.cancel(conn, job_id)
    if done is None:
        return None
    job, what = done
    logged = {"job_id": str(job.id), "job_type": job.type}
    if what is control.Cancelled.CANCELLED:
        metrics.CANCELLED.inc()
        log.info("job cancelled", extra=logged)
    elif what is control.Cancelled.REQUESTED:
        log.info("cancel requested", extra=logged)
    return done


async def retry_job(request: Request) -> Response:
    job_id = _job_id(request)
    if job_id is None:
        return _not_found(request)
    state = state_of(request.app)
    done = await retry(state.engine, state.notifier, job_id)
    if done is None:
        return _not_found(request)
    job, retried = done
    if retried:
        return JSONResponse(job_json(job))
    return error_response(409, refusal(job, RETRYABLE, "retried"))


async def cancel_job(request: Request) -> Response:
    """POST /jobs/{id}/cancel: 200 cancelled at once, 202 asked of the worker running it."""
    job_id = _job_id(request)
    if job_id is None:
        return _not_found(request)
    done = await cancel(state_of(request.app).engine, job_id)
    if done is None:
        return _not_found(request)
    job, what = done
    if what is control.Cancelled.CANCELLED:
        return JSONResponse(job_json(job))
    if what is control.Cancelled.REQUESTED:
        return JSONResponse(job_json(job), status_code=202)
    return error_response(409, refusal(job, CANCELLABLE, "cancelled"))


def refusal(job: Job, sources: frozenset[Status], done: str) -> str:
    """Why an operation on `job` was refused: it is in none of the statuses it starts from."""
    *others, last = sorted(sources)
    allowed = f"{', '.join(others)} or {last}" if others else last
    return f"job {job.id} is {job.status.value}; only {allowed} jobs can be {done}"
