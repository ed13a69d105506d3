"""`GET /jobs` (list and search, newest first, by keyset pages) and `GET /queues` (each
queue's depths, and whether it is paused): thin HTTP over `jobcore.search`."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from jobcore import pauses, search
from jobqueue_api import validation
from jobqueue_api.database import REQUEST_DEADLINE, in_turn
from jobqueue_api.errors import error_response
from jobqueue_api.records import depth_json, job_json
from jobqueue_api.state import state_of


async def list_jobs(request: Request) -> Response:
    try:
        params = validation.query(request.query_params.multi_items(), validation.LIST_PARAMETERS)
        asked = validation.list_query(params)
    except validation.InvalidRequest as exc:
        return error_response(400, str(exc))
    engine = state_of(request.app).engine
    async with asyncio.timeout(REQUEST_DEADLINE), in_turn(engine), engine.connect() as conn:
        found, last = await search.list_jobs(conn, asked.filters, asked.limit, asked.before)
    cursor = validation.encode_cursor(last) if last is not None else None
    return JSONResponse({"jobs": [job_json(job) for job in found], "next_cursor": cursor})


async def queues(request: Request) -> Response:
    try:
        validation.query(request.query_params.multi_items(), ())
    except validation.InvalidRequest as exc:
        return error_response(400, str(exc))
    engine = state_of(request.app).engine
    async with asyncio.timeout(REQUEST_DEADLINE), in_turn(engine), engine.connect() as conn:
        rows = await pauses.queues_with_pauses(conn)
    return JSONResponse({"queues": [depth_json(depth, paused) for depth, paused in rows]})
