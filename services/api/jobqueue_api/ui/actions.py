"""The dashboard's actions (POST, each refused with 403 before anything is done unless its
form carries the CSRF token): retry and cancel one job, retry a bounded batch of dead
letters, retry or cancel the jobs selected on the jobs page, pause and resume a queue, sign
in and out.

Retry and cancel are the API's own (`jobs.retry`, `jobs.cancel`: the same statements,
guards, notifications, logs and metrics as `POST /jobs/{id}/retry` and `/cancel`).
"""

from __future__ import annotations

import time
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from jobcore import bulk, control, pauses
from jobcore.errors import InvalidRequest, SchemaNotAtHead
from jobcore.ids import parse_id
from jobcore.states import Status
from jobqueue_api import jobs, metrics, validation
from jobqueue_api.state import state_of
from jobqueue_api.ui import access, pages, render
from jobqueue_api.ui.session import new_session, signed_in

# A form the dashboard sends is a few short fields; the bulk form, one per selected job.
MAX_FIELDS = 10
MAX_BULK_FIELDS = 600
# The list parameters the bulk form carries back to the jobs page.
RETURNED = ("status", "type", "queue", "limit", "cursor")


async def _form(request: Request, max_fields: int = MAX_FIELDS) -> FormData | None:
    """The posted form, or None when its CSRF token is missing or wrong."""
    form = await request.form(max_files=0, max_fields=max_fields)
    return form if access.csrf_ok(request, form) else None


def _refused(request: Request) -> Response:
    return render.error(
        request,
        403,
        "This form's security token is missing or out of date; nothing was done. "
        "Open the page again and repeat the action.",
    )


def _text(form: FormData, name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


def _return_to_dead_letters(form: FormData) -> list[tuple[str, str]] | None:
    """The dead letters page's filters, when the form was posted from that page."""
    if _text(form, "view") != "dead-letters":
        return None
    return [(name, _text(form, name)) for name in ("type", "queue") if _text(form, name)]


async def retry(request: Request) -> Response:
    form = await _form(request)
    if form is None:
        return _refused(request)
    job_id = parse_id(request.path_params["id"])
    done = None
    if job_id is not None:
        state = state_of(request.app)
        done = await jobs.retry(state.engine, state.notifier, job_id)
    if done is None:
        return render.error(request, 404, f"There is no job {request.path_params['id']!r}.")
    job, retried = done
    notice = f"Job {job.id} retried: pending again, with a fresh attempt budget."
    error = None if retried else jobs.refusal(job, jobs.RETRYABLE, "retried")
    status = 200 if retried else 409
    back = _return_to_dead_letters(form)
    if back is not None:
        return await pages.dead_letters_view(
            request, back, notice=notice if retried else None, error=error, status=status
        )
    return pages.job_view(
        request, job, notice=notice if retried else None, error=error, status=status
    )


async def cancel(request: Request) -> Response:
    form = await _form(request)
    if form is None:
        return _refused(request)
    job_id = parse_id(request.path_params["id"])
    done = None
    if job_id is not None:
        done = await jobs.cancel(state_of(request.app).engine, job_id)
    if done is None:
        return render.error(request, 404, f"There is no job {request.path_params['id']!r}.")
    job, what = done
    if what is control.Cancelled.CANCELLED:
        return pages.job_view(request, job, notice=f"Job {job.id} cancelled.")
    if what is control.Cancelled.REQUESTED:
        notice = (
            f"Cancel of job {job.id} requested: the worker running it stops the attempt "
            "within a second, and the job ends cancelled unless its handler finishes first."
        )
        return pages.job_view(request, job, notice=notice, status=202)
    refusal = jobs.refusal(job, jobs.CANCELLABLE, "cancelled")
    return pages.job_view(request, job, error=refusal, status=409)


async def retry_dead_letters(request: Request) -> Response:
    """Retry the newest BULK_RETRY_LIMIT dead letters matching the form's type and queue."""
    form = await _form(request)
    if form is None:
        return _refused(request)
    given = [(name, _text(form, name)) for name in ("type", "queue") if _text(form, name)]
    params: dict[str, Any] = dict(given)
    params.update(status=Status.DEAD_LETTER.value, limit=str(pages.BULK_RETRY_LIMIT))
    try:
        asked = validation.list_query(params)
    except validation.InvalidRequest as exc:
        return await pages.dead_letters_view(request, given, error=str(exc), status=400)
    found, last = await pages.list_page(request, asked)
    retried = 0
    state = state_of(request.app)
    for job in found:
        done = await jobs.retry(state.engine, state.notifier, job.id)
        # A job retried or cancelled meanwhile by someone else is left as it is.
        retried += done is not None and done[1]
    notice = f"Retried {retried} of {len(found)} dead letters"
    notice += " matching these filters." if given else "."
    if last is not None:
        notice += f" More remain: retry again for the next {pages.BULK_RETRY_LIMIT}."
    else:
        notice += " None remain."
    return await pages.dead_letters_view(request, given, notice=notice)


async def bulk_action(request: Request) -> Response:
    """ "Retry selected" / "Cancel selected": the checked jobs, through the API's bulk
    functions; those whose status does not allow it are left as they are, and counted."""
    form = await _form(request, MAX_BULK_FIELDS)
    if form is None:
        return _refused(request)
    back = [(name, _text(form, name)) for name in RETURNED if _text(form, name)]
    wanted = [v for v in form.getlist("id") if isinstance(v, str)]
    # A job listed twice in the form is one job: counted once, changed at most once.
    ids = list(dict.fromkeys(parse_id(v) for v in wanted))
    action = _text(form, "action")
    if action not in ("retry", "cancel") or None in ids or len(ids) > bulk.MAX_IDS:
        return render.error(request, 400, "Select up to 1,000 listed jobs, then Retry or Cancel.")
    if not ids:
        return await pages.jobs_view(request, back, notice="No job was selected: nothing done.")
    selection = bulk.Selection(
        statuses=None, type=None, queue=None, ids=tuple(i for i in ids if i), limit=len(ids)
    )
    state = state_of(request.app)
    async with state.engine.connect() as conn:
        if action == "retry":
            retried = await bulk.retry_matching(conn, selection)
            changed = retried.retried
            notice = f"Retried {changed} of {len(ids)} selected jobs"
        else:
            cancelled = await bulk.cancel_matching(conn, selection)
            changed = cancelled.cancelled + cancelled.cancel_requested
            if cancelled.cancelled:
                metrics.CANCELLED.inc(cancelled.cancelled)
            notice = f"Cancelled {cancelled.cancelled} of {len(ids)} selected jobs"
            if cancelled.cancel_requested:
                notice += f" and asked the workers running {cancelled.cancel_requested} to stop"
    if action == "retry" and changed:
        state.notifier.jobs_due()
    left = len(ids) - changed
    notice += f"; {left} left as they were (their status does not allow it)." if left else "."
    return await pages.jobs_view(request, back, notice=notice)


async def pause(request: Request) -> Response:
    return await _set_paused(request, True)


async def resume(request: Request) -> Response:
    return await _set_paused(request, False)


async def _set_paused(request: Request, paused: bool) -> Response:
    form = await _form(request)
    if form is None:
        return _refused(request)
    queue = request.path_params["queue"]
    try:
        async with state_of(request.app).engine.connect() as conn:
            if paused:
                await pauses.pause(conn, queue)
            else:
                await pauses.resume(conn, queue)
    except InvalidRequest as exc:
        return render.error(request, 400, str(exc))
    except SchemaNotAtHead as exc:
        return render.error(request, 503, str(exc))
    return RedirectResponse(f"{access.root(request)}/", status_code=303)


async def sign_in(request: Request) -> Response:
    home = f"{access.root(request)}/"
    tokens = access.tokens(request)
    if not tokens:
        return RedirectResponse(home, status_code=303)
    form = await _form(request)
    if form is None:
        return _refused(request)
    back = pages.safe_next(request, _text(form, "next"))
    if not signed_in(_text(form, "token"), tokens):
        context = {"next": back, "error": "That token is not one of API_TOKENS."}
        return render.page(request, "sign_in.html", context, 401)
    response = RedirectResponse(back, status_code=303)
    access.set_session(request, response, new_session(_text(form, "token"), time.time()))
    return response


async def sign_out(request: Request) -> Response:
    form = await _form(request)
    if form is None:
        return _refused(request)
    response = RedirectResponse(f"{access.root(request)}/sign-in", status_code=303)
    access.clear_session(request, response)
    return response
