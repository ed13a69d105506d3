"""Each client call as a flow (see `retries`): the requests it makes, and how it reads the
answers into records or typed errors. `Client` and `AsyncClient` run these same flows.

Safe to repeat: every submission carries an idempotency key (the caller's, or one made
once per call and per item), so a retry after a lost answer replays the job instead of
creating another. A cancel whose earlier try may have been applied answers 409 on the next
try (the job already moved); the flow then reads the job and returns it when it is
cancelled. A retry is not sent again once it may have been applied (see `retry`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote
from uuid import UUID, uuid4

from jobcore.client.errors import ClientError, Invalid, WaitTimeout
from jobcore.client.records import Job, QueueDepth, Submitted
from jobcore.client.retries import LEAST, Answer, Flow, OutOfTime, Request, Retries, send
from jobcore.states import Status

MAX_BATCH = 1000  # items per POST /jobs/batch, the API's limit
MAX_WAIT = 60.0  # the longest `?wait=` the API takes
PROGRESS_ROUND = 2.0  # the wait of one long poll when someone follows the job's progress
ANSWER_MARGIN = 10.0  # seconds allowed for a long poll's answer beyond its wait


class Calls:
    """The flows of one client: its retries and its base URL (for error messages)."""

    def __init__(self, retries: Retries, base_url: str) -> None:
        self.retries = retries
        self.base_url = base_url

    def _send(self, request: Request) -> Flow[Answer]:
        return send(request, self.retries, self.base_url)

    def submit(
        self, job_type: str, payload: Any, idempotency_key: str | None, fields: Mapping[str, Any]
    ) -> Flow[Job]:
        key = idempotency_key or new_key()
        body = _encode(create_item(job_type, payload, fields))
        answer = yield from self._send(
            Request("POST", "/jobs", body=body, headers={"Idempotency-Key": key})
        )
        return _job(answer, None)

    def submit_many(self, jobs: Iterable[Mapping[str, Any]]) -> Flow[list[Submitted]]:
        items: list[dict[str, Any]] = []
        made: set[str] = set()  # keys this call generated: nobody else can have used them
        for index, job in enumerate(jobs):
            if not isinstance(job, Mapping):
                raise Invalid(f"item {index} is a {type(job).__name__}, not a mapping")
            item = _fields(job)
            if item.get("idempotency_key") is None:
                item["idempotency_key"] = new_key()
                made.add(item["idempotency_key"])
            items.append(item)
        results: list[Submitted] = []
        for offset in range(0, len(items), MAX_BATCH):
            chunk = items[offset : offset + MAX_BATCH]
            answer = yield from self._send(
                Request("POST", "/jobs/batch", body=_encode({"jobs": chunk}))
            )
            if not answer.ok:
                raise _in_chunk(answer.error(), offset, len(chunk))
            for item, result in zip(chunk, _document(answer)["results"], strict=True):
                key = item["idempotency_key"]
                status = result["status"]
                # A replay of a key made by this call is this call's own earlier try.
                if status == "replayed" and key in made:
                    status = "created"
                results.append(Submitted(status, result.get("id"), key, result.get("error")))
        return results

    def get(self, job_id: str | UUID) -> Flow[Job]:
        answer = yield from self._send(Request("GET", _path(job_id)))
        return _job(answer, str(job_id))

    def wait(
        self,
        job_id: str | UUID,
        timeout: float | None,
        progress: Callable[[Job], None] | None = None,
    ) -> Flow[Job]:
        """Long polls of at most MAX_WAIT each (PROGRESS_ROUND when following progress),
        until the job has finished or `timeout` seconds have passed (WaitTimeout; a timeout
        too short for a poll looks once).

        The timeout bounds the whole wait: the polls, and the retries of one that broke
        (their backoff and each try's own timeout), end by then, but for ANSWER_GRACE for
        the answer of the poll that the API ends at it. A wait that got no answer at all in
        that time raises the error its last try met (Unavailable)."""
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        longest = PROGRESS_ROUND if progress is not None else MAX_WAIT
        last: Job | None = None
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left < LEAST:
                if last is None:  # a zero timeout still looks once
                    last = yield from self.get(job_id)
                    if last.finished:
                        return last
                raise _timed_out(last, timeout)
            seconds = longest if left is None else min(longest, left)
            poll = Request("GET", _path(job_id), wait=seconds, timeout=seconds + ANSWER_MARGIN)
            try:
                answer = yield from send(poll, self.retries, self.base_url, deadline=deadline)
            except OutOfTime as out:
                if last is None:
                    raise out.error from out.error.__cause__
                raise _timed_out(last, timeout) from None
            last = _job(answer, str(job_id))
            if last.finished:
                return last
            if progress is not None:
                progress(last)

    def retry(self, job_id: str | UUID) -> Flow[Job]:
        # Not sent again once it may have been applied: the job could have run and failed
        # again in between, and a second retry would run it once more.
        answer = yield from send(
            Request("POST", _path(job_id, "retry")), self.retries, self.base_url, repeatable=False
        )
        return _job(answer, str(job_id))

    def cancel(self, job_id: str | UUID) -> Flow[Job]:
        answer = yield from self._send(Request("POST", _path(job_id, "cancel")))
        if answer.status == 409 and answer.after_lost:
            current = yield from self.get(job_id)
            if current.status is Status.CANCELLED:
                return current
        return _job(answer, str(job_id))

    def list_page(
        self, filters: Mapping[str, str], cursor: str | None
    ) -> Flow[tuple[list[Job], str | None]]:
        params = dict(filters)
        if cursor is not None:
            params["cursor"] = cursor
        answer = yield from self._send(Request("GET", "/jobs", params=params))
        page = _document(answer)
        return [Job.from_json(job) for job in page["jobs"]], page["next_cursor"]

    def set_paused(self, queue: str, paused: bool) -> Flow[bool]:
        action = "pause" if paused else "resume"
        path = f"/queues/{quote(queue, safe='')}/{action}"
        answer = yield from self._send(Request("POST", path))
        return bool(_document(answer)["paused"])

    def act_on_matching(self, action: str, selection: Mapping[str, Any]) -> Flow[dict[str, Any]]:
        """`POST /jobs/cancel` or `/jobs/retry` with the filter `selection` (None values
        left out); the API's counts. A bulk retry is not sent again once it may have been
        applied (see `retry`); a bulk cancel may be (a job is never cancelled twice)."""
        body = _encode({name: value for name, value in selection.items() if value is not None})
        request = Request("POST", f"/jobs/{action}", body=body)
        answer = yield from send(
            request, self.retries, self.base_url, repeatable=action == "cancel"
        )
        return _document(answer)

    def queues(self) -> Flow[list[QueueDepth]]:
        answer = yield from self._send(Request("GET", "/queues"))
        return [QueueDepth.from_json(depth) for depth in _document(answer)["queues"]]


def selection(
    status: str | Sequence[str] | None,
    type: str | None,
    queue: str | None,
    ids: Sequence[str | UUID] | None,
    limit: int | None,
) -> dict[str, Any]:
    """A bulk action's filter as the API takes it."""
    return {
        "status": status if status is None or isinstance(status, str) else list(status),
        "type": type,
        "queue": queue,
        "ids": None if ids is None else [str(job_id) for job_id in ids],
        "limit": limit,
    }


def _timed_out(job: Job, timeout: float | None) -> WaitTimeout:
    return WaitTimeout(f"job {job.id} is still {job.status.value} after {timeout:g}s", job=job)


def new_key() -> str:
    """An idempotency key made by the client, once per submission (its retries reuse it)."""
    return f"jqc-{uuid4()}"


def list_filters(
    status: str | Iterable[str] | None = None,
    type: str | None = None,
    queue: str | None = None,
    page_size: int = 100,
) -> dict[str, str]:
    """`GET /jobs`'s parameters: one status or several, a type, a queue, the page size."""
    filters = {"limit": str(page_size)}
    if status is not None:
        filters["status"] = status if isinstance(status, str) else ",".join(status)
    if type is not None:
        filters["type"] = type
    if queue is not None:
        filters["queue"] = queue
    return filters


def create_item(job_type: str, payload: Any, fields: Mapping[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = {"type": job_type}
    if payload is not None:
        item["payload"] = payload
    item.update(_fields(fields))
    return item


def _fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Fields as JSON carries them: `run_at` as RFC 3339 text, `delay`/`timeout` as seconds."""
    out = dict(fields)
    if isinstance(out.get("run_at"), datetime):
        out["run_at"] = out["run_at"].isoformat()
    for name in ("delay", "timeout"):
        if isinstance(out.get(name), timedelta):
            out[name] = out[name].total_seconds()
    return out


def _encode(body: Any) -> bytes:
    """`body` as JSON: refused here (Invalid) when JSON cannot carry it."""
    try:
        return json.dumps(body, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise Invalid(f"the job is not JSON: {exc}") from None


def _path(job_id: str | UUID, action: str | None = None) -> str:
    path = f"/jobs/{quote(str(job_id), safe='')}"
    return path if action is None else f"{path}/{action}"


def _document(answer: Answer, job_id: str | None = None) -> dict[str, Any]:
    """A successful answer's JSON object; else the error it stands for."""
    if not answer.ok:
        raise answer.error(job_id)
    if not isinstance(answer.body, dict):
        raise ClientError(
            f"the API answered {answer.status} without a JSON object: {str(answer.body)[:200]}",
            status=answer.status,
            job_id=job_id,
            request_id=answer.headers.get("x-request-id"),
        )
    return answer.body


def _job(answer: Answer, job_id: str | None) -> Job:
    return Job.from_json(_document(answer, job_id))


def _in_chunk(error: Exception, offset: int, size: int) -> Exception:
    """A batch's error, said of the items it concerns when earlier batches went through."""
    if offset == 0 or not isinstance(error, ClientError):
        return error
    return type(error)(
        f"items {offset} to {offset + size - 1} (indexes below count from {offset}; the "
        f"{offset} items before them were submitted): {error.message}",
        status=error.status,
        request_id=error.request_id,
        retry_after=error.retry_after,
    )
