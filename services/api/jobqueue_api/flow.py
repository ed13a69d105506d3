"""Flow control over HTTP: pausing and resuming a queue (`POST /queues/{queue}/pause`,
`/resume`) and the bulk actions (`POST /jobs/cancel`, `POST /jobs/retry`); thin HTTP over
`jobcore.pauses` and `jobcore.bulk` (docs/api.md#pausing-a-queue, docs/api.md#bulk-actions)."""

from __future__ import annotations

import asyncio
import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from jobcore import bulk, pauses
from jobcore.errors import InvalidRequest
from jobqueue_api import metrics, validation
from jobqueue_api.database import REQUEST_DEADLINE, in_turn
from jobqueue_api.errors import error_response
from jobqueue_api.state import state_of

log = logging.getLogger("jobqueue.api")

# A bulk action of 10,000 jobs runs 20 batches of 500: more than one request's deadline.
BULK_DEADLINE = 120.0


async def pause_queue(request: Request) -> Response:
    return await _set_paused(request, True)


async def resume_queue(request: Request) -> Response:
    return await _set_paused(request, False)


async def _set_paused(request: Request, paused: bool) -> Response:
    queue = request.path_params["queue"]
    try:
        validation.query(request.query_params.multi_items(), ())
        pauses.check_queue(queue)
    except InvalidRequest as exc:
        return error_response(400, str(exc))
    engine = state_of(request.app).engine
    async with asyncio.timeout(REQUEST_DEADLINE), in_turn(engine), engine.connect() as conn:
        if paused:
            await pauses.pause(conn, queue)
        else:
            await pauses.resume(conn, queue)
    log.info("queue paused" if paused else "queue resumed", extra={"queue": queue})
    return JSONResponse({"queue": queue, "paused": paused})


async def cancel_jobs(request: Request) -> Response:
    """POST /jobs/cancel: the matching jobs cancelled, or their running attempts asked to stop."""
    try:
        selection = bulk.selection_from_json(validation.parse_json(await request.body()))
    except InvalidRequest as exc:
        return error_response(400, str(exc))
    engine = state_of(request.app).engine
    async with asyncio.timeout(BULK_DEADLINE), in_turn(engine), engine.connect() as conn:
        done = await bulk.cancel_matching(conn, selection)
    if done.cancelled:
        metrics.CANCELLED.inc(done.cancelled)
    log.info(
        "jobs cancelled by filter",
        extra={"cancelled": done.cancelled, "cancel_requested": done.cancel_requested},
    )
    return JSONResponse(
        {"cancelled": done.cancelled, "cancel_requested": done.cancel_requested, "more": done.more}
    )


async def retry_jobs(request: Request) -> Response:
    """POST /jobs/retry: the matching dead_letter, failed and cancelled jobs run again."""
    try:
        selection = bulk.selection_from_json(validation.parse_json(await request.body()))
    except InvalidRequest as exc:
        return error_response(400, str(exc))
    state = state_of(request.app)
    engine = state.engine
    async with asyncio.timeout(BULK_DEADLINE), in_turn(engine), engine.connect() as conn:
        done = await bulk.retry_matching(conn, selection)
    if done.retried:
        state.notifier.jobs_due()
    log.info("jobs retried by filter", extra={"retried": done.retried})
    return JSONResponse({"retried": done.retried, "more": done.more})
