"""The dashboard's actions in process: retry, cancel and the bounded bulk retry do what the
API's endpoints do (the same functions), and nothing is done without the CSRF token."""

from __future__ import annotations

import re

import pytest

from jobqueue_api.state import state_of
from jobqueue_api.ui.pages import BULK_RETRY_LIMIT
from tests.api.conftest import app_of
from tests.api.ui.seed import add_jobs, altered, csrf_of, table


def engine_of(api):
    return state_of(app_of(api)).engine


async def token(api, path: str = "/ui/jobs") -> str:
    """The CSRF token of a page's forms (the page also sets this browser's secret cookie)."""
    return csrf_of((await api.get(path)).text)


async def record(api, job_id) -> dict:
    return (await api.get(f"/jobs/{job_id}")).json()


async def test_retry_makes_a_dead_letter_pending_with_a_fresh_budget_as_the_api_does(
    api, captured_logs
):
    [job_id] = await add_jobs(engine_of(api), status="dead_letter", last_error="boom")
    page = await api.post(f"/ui/jobs/{job_id}/retry", data={"csrf_token": await token(api)})
    assert page.status_code == 200
    assert f"Job {job_id} retried" in page.text and 'role="status"' in page.text
    job = await record(api, job_id)
    assert (job["status"], job["attempts"], job["finished_at"]) == ("pending", 0, None)
    # The API's own retry ran: its log line.
    assert any(
        line["msg"] == "manual_retry" and line["job_id"] == str(job_id)
        for line in captured_logs.lines()
    )
    # Pending now: the page offers Cancel, no more Retry.
    assert re.findall(r'<button type="submit"[^>]*>(\w+)</button>', page.text) == ["Cancel"]


async def test_a_retry_the_status_does_not_allow_is_a_409_page_and_changes_nothing(api):
    [job_id] = await add_jobs(engine_of(api), status="completed")
    before = await record(api, job_id)
    page = await api.post(f"/ui/jobs/{job_id}/retry", data={"csrf_token": await token(api)})
    assert page.status_code == 409
    assert f"job {job_id} is completed; only cancelled, dead_letter or failed" in page.text
    assert await record(api, job_id) == before


async def test_cancel_of_a_pending_job_cancels_it_and_counts_it_as_the_api_does(api):
    [job_id] = await add_jobs(engine_of(api), status="pending")
    metrics_before = (await api.get("/metrics")).text
    page = await api.post(f"/ui/jobs/{job_id}/cancel", data={"csrf_token": await token(api)})
    assert page.status_code == 200 and f"Job {job_id} cancelled." in page.text
    assert (await record(api, job_id))["status"] == "cancelled"
    assert _cancelled_total(metrics_before) + 1 == _cancelled_total(
        (await api.get("/metrics")).text
    )


def _cancelled_total(text: str) -> float:
    found = re.search(r"^jobs_cancelled_total (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


async def test_cancel_of_a_running_job_asks_its_worker_202(api):
    [job_id] = await add_jobs(engine_of(api), status="processing", attempts=1)
    page = await api.post(f"/ui/jobs/{job_id}/cancel", data={"csrf_token": await token(api)})
    assert page.status_code == 202 and "Cancel of job" in page.text
    job = await record(api, job_id)
    assert job["status"] == "processing" and job["cancel_requested_at"] is not None


async def test_cancel_of_a_finished_job_is_a_409_page_and_changes_nothing(api):
    [job_id] = await add_jobs(engine_of(api), status="failed")
    before = await record(api, job_id)
    page = await api.post(f"/ui/jobs/{job_id}/cancel", data={"csrf_token": await token(api)})
    assert page.status_code == 409 and "only dead_letter, pending or processing" in page.text
    assert await record(api, job_id) == before


@pytest.mark.parametrize("action", ["retry", "cancel"])
async def test_an_action_on_an_unknown_job_is_a_404_page(api, action):
    csrf = await token(api)
    for job_id in ("01a22fbe-9723-7ee7-be02-c4f63a9eacea", "not-an-id"):
        page = await api.post(f"/ui/jobs/{job_id}/{action}", data={"csrf_token": csrf})
        assert page.status_code == 404 and "There is no job" in page.text


async def test_retry_from_the_dead_letters_page_shows_that_page_again(api):
    engine = engine_of(api)
    [job_id, other] = await add_jobs(engine, 2, status="dead_letter", queue="mail")
    page = await api.post(
        f"/ui/jobs/{job_id}/retry",
        data={"csrf_token": await token(api), "view": "dead-letters", "queue": "mail"},
    )
    assert page.status_code == 200 and "<h1>Dead letters</h1>" in page.text
    assert [row[0] for row in table(page.text)[1:]] == [str(other)]


def _wrong_tokens():
    return {
        "missing": lambda csrf: {},
        "empty": lambda csrf: {"csrf_token": ""},
        "altered": lambda csrf: {"csrf_token": altered(csrf)},
        "of another browser": None,  # filled in by the test
    }


@pytest.mark.parametrize("wrong", list(_wrong_tokens()))
@pytest.mark.parametrize("action", ["retry", "cancel", "bulk"])
async def test_an_action_without_its_csrf_token_is_refused_403_and_does_nothing(
    make_api, wrong, action
):
    api = await make_api()
    [job_id] = await add_jobs(engine_of(api), status="dead_letter", queue="csrf")
    csrf = await token(api)
    if wrong == "of another browser":
        other = await make_api()
        form = {"csrf_token": await token(other)}
    else:
        form = _wrong_tokens()[wrong](csrf)
    path = {
        "retry": f"/ui/jobs/{job_id}/retry",
        "cancel": f"/ui/jobs/{job_id}/cancel",
        "bulk": "/ui/dead-letters/retry",
    }[action]
    before = await record(api, job_id)
    refused = await api.post(path, data={**form, "queue": "csrf"})
    assert refused.status_code == 403 and "nothing was done" in refused.text
    assert await record(api, job_id) == before
    # The same request with the page's token goes through.
    assert (await api.post(path, data={"csrf_token": csrf, "queue": "csrf"})).status_code == 200
    assert (await record(api, job_id))["status"] != "dead_letter"


async def test_a_browser_without_the_secret_cookie_cannot_use_a_token_it_copied(api):
    [job_id] = await add_jobs(engine_of(api), status="dead_letter")
    csrf = await token(api)
    api.cookies.clear()
    refused = await api.post(f"/ui/jobs/{job_id}/retry", data={"csrf_token": csrf})
    assert refused.status_code == 403
    assert (await record(api, job_id))["status"] == "dead_letter"


async def test_bulk_retry_retries_at_most_its_limit_per_click_and_says_whether_more_remain(api):
    engine = engine_of(api)
    many = BULK_RETRY_LIMIT + 30
    dead = await add_jobs(engine, many, status="dead_letter", queue="bulk")
    elsewhere = await add_jobs(engine, 5, status="dead_letter", queue="other")
    csrf = await token(api, "/ui/dead-letters")
    first = await api.post("/ui/dead-letters/retry", data={"csrf_token": csrf, "queue": "bulk"})
    assert first.status_code == 200
    assert f"Retried {BULK_RETRY_LIMIT} of {BULK_RETRY_LIMIT} dead letters matching" in first.text
    assert "More remain" in first.text
    counts = await _statuses(api, dead)
    assert counts == {"pending": BULK_RETRY_LIMIT, "dead_letter": 30}
    # The newest first, as the page lists them.
    newest = sorted(map(str, dead), reverse=True)[:BULK_RETRY_LIMIT]
    assert {str(i) for i in dead if (await record(api, i))["status"] == "pending"} == set(newest)
    second = await api.post("/ui/dead-letters/retry", data={"csrf_token": csrf, "queue": "bulk"})
    assert "Retried 30 of 30 dead letters matching these filters. None remain." in second.text
    assert await _statuses(api, dead) == {"pending": many}
    assert await _statuses(api, elsewhere) == {"dead_letter": 5}


async def test_bulk_retry_takes_the_type_filter_and_refuses_a_bad_one(api):
    engine = engine_of(api)
    mail = await add_jobs(engine, 3, status="dead_letter", type="webhook")
    sleep = await add_jobs(engine, 2, status="dead_letter", type="sleep")
    csrf = await token(api, "/ui/dead-letters")
    done = await api.post("/ui/dead-letters/retry", data={"csrf_token": csrf, "type": "webhook"})
    assert "Retried 3 of 3" in done.text
    assert await _statuses(api, mail) == {"pending": 3}
    assert await _statuses(api, sleep) == {"dead_letter": 2}
    bad = await api.post("/ui/dead-letters/retry", data={"csrf_token": csrf, "queue": "Bad Q"})
    assert bad.status_code == 400 and "queue" in bad.text
    assert await _statuses(api, sleep) == {"dead_letter": 2}


async def _statuses(api, ids) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job_id in ids:
        status = (await record(api, job_id))["status"]
        counts[status] = counts.get(status, 0) + 1
    return counts


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},  # a sibling subdomain, which could set our cookies
    ],
)
async def test_an_action_posted_from_another_site_is_refused_even_with_its_token(api, headers):
    [job_id] = await add_jobs(engine_of(api), status="dead_letter")
    csrf = await token(api)
    refused = await api.post(f"/ui/jobs/{job_id}/retry", data={"csrf_token": csrf}, headers=headers)
    assert refused.status_code == 403 and refused.headers["x-frame-options"] == "DENY"
    assert (await record(api, job_id))["status"] == "dead_letter"
    # From this site's own page (as a browser says it), it goes through.
    same = {"Origin": "http://api", "Sec-Fetch-Site": "same-origin"}
    allowed = await api.post(f"/ui/jobs/{job_id}/retry", data={"csrf_token": csrf}, headers=same)
    assert allowed.status_code == 200
    assert (await record(api, job_id))["status"] == "pending"


async def test_selected_jobs_are_cancelled_once_each_and_counted_as_the_api_does(api):
    pending = await add_jobs(engine_of(api), 2, status="pending")
    [done] = await add_jobs(engine_of(api), status="completed")
    ids = [str(pending[0]), str(pending[0]), str(pending[1]), str(done)]  # one listed twice
    before = (await api.get("/metrics")).text
    page = await api.post(
        "/ui/jobs/bulk",
        data={"csrf_token": await token(api), "action": "cancel", "id": ids},
    )
    assert page.status_code == 200
    assert "Cancelled 2 of 3 selected jobs; 1 left as they were" in page.text
    assert [(await record(api, i))["status"] for i in pending] == ["cancelled"] * 2
    assert _cancelled_total(before) + 2 == _cancelled_total((await api.get("/metrics")).text)
