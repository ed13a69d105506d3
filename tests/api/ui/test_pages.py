"""The dashboard's pages in process (the real app on the real database, over httpx): what
each shows, the security headers on every response, escaping, and bad input."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa

from jobcore.states import Status
from jobqueue_api.jobs import CANCELLABLE, RETRYABLE
from jobqueue_api.state import state_of
from jobqueue_api.ui import pages
from jobqueue_api.ui.guard import SECURITY_HEADERS
from tests.api.conftest import app_of
from tests.api.ui.seed import add_jobs, links, table

SCRIPT = "<script>alert(1)</script>"


def engine_of(api):
    return state_of(app_of(api)).engine


async def test_the_queues_page_has_one_row_per_queue_with_the_depths_get_queues_gives(api):
    engine = engine_of(api)
    await add_jobs(engine, 3, queue="mail")
    await add_jobs(engine, 2, queue="mail", scheduled=True)
    await add_jobs(engine, 1, queue="mail", status="processing")
    await add_jobs(engine, 4, queue="reports", status="dead_letter")
    await add_jobs(engine, 5, queue="reports", status="completed")
    page = await api.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    rows = table(page.text)
    assert rows[0] == [
        "Queue",
        "Pending",
        "Scheduled",
        "Processing",
        "Dead letters",
        "Oldest pending",
        "Claims",
    ]
    shown = {row[0]: row[1:5] for row in rows[1:]}
    expected = {
        q["queue"]: [str(q[k]) for k in ("pending", "scheduled", "processing", "dead_letter")]
        for q in (await api.get("/queues")).json()["queues"]
    }
    assert shown == expected == {"mail": ["3", "2", "1", "0"], "reports": ["0", "0", "0", "4"]}
    assert ("mail", "/ui/jobs?queue=mail") in links(page.text)
    assert ("4", "/ui/dead-letters?queue=reports") in links(page.text)


async def test_the_chart_counts_the_jobs_finished_in_the_last_hour_by_status(api):
    engine = engine_of(api)
    await add_jobs(engine, 3, status="completed", finished_minutes_ago=5)
    await add_jobs(engine, 2, status="failed", finished_minutes_ago=5)
    await add_jobs(engine, 1, status="cancelled", finished_minutes_ago=20)
    await add_jobs(engine, 7, status="completed", finished_minutes_ago=90)  # too old
    page = (await api.get("/ui/")).text
    bars = re.findall(r'<rect class="bar (\w+)"[^>]*><title>[0-9:]+ UTC: (\d+) \w+</title>', page)
    assert sorted(bars) == [("cancelled", "1"), ("completed", "3"), ("failed", "2")]
    assert "6 in all" in page
    assert "<svg" in page and 'role="img"' in page


async def test_an_empty_database_shows_an_empty_table_and_an_empty_chart(api):
    page = await api.get("/ui/")
    assert page.status_code == 200
    assert "No jobs yet." in page.text and "0 in all; none yet" in page.text


PAGES = ["/ui/", "/ui/jobs", "/ui/dead-letters", "/ui/static/dashboard.css"]


@pytest.mark.parametrize(
    "path, status",
    [
        *((p, 200) for p in PAGES),
        ("/ui", 308),
        ("/ui/jobs?status=bogus", 400),
        ("/ui/jobs/not-an-id", 404),
        ("/ui/jobs/01a22fbe-9723-7ee7-be02-c4f63a9eacea", 404),
        ("/ui/no-such-page", 404),
        ("/ui/static/missing.css", 404),
        ("/ui/sign-in", 303),  # nothing to sign in to without API_TOKENS
    ],
)
async def test_every_dashboard_response_carries_the_security_headers(api, path, status):
    response = await api.get(path)
    assert response.status_code == status
    for name, value in SECURITY_HEADERS.items():
        assert response.headers[name] == value
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    if response.status_code >= 400:
        # An error is a page too, not the API's JSON.
        assert response.headers["content-type"].startswith("text/html")
        assert "Traceback" not in response.text
    if not path.startswith("/ui/static/"):
        assert response.headers["cache-control"] == "no-store"


async def test_a_wrong_method_is_a_405_page_with_the_headers(api):
    response = await api.post("/ui/jobs")
    assert response.status_code == 405
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["content-type"].startswith("text/html")


async def test_a_script_in_a_payload_result_error_type_or_queue_is_shown_as_text(api):
    engine = engine_of(api)
    [job_id] = await add_jobs(
        engine,
        status="dead_letter",
        type=SCRIPT,
        payload={"note": SCRIPT, SCRIPT: [1]},
        result=SCRIPT,
        last_error=f'boom {SCRIPT} <img src=x onerror="alert(2)">',
        errors=[_failed(1, f"boom {SCRIPT}", f'raise ValueError("{SCRIPT}<img src=x>")')],
    )
    for path in [f"/ui/jobs/{job_id}", "/ui/jobs", "/ui/dead-letters", f"/ui/jobs?type={SCRIPT}"]:
        page = await api.get(path)
        assert page.status_code == 200, path
        assert "<script>alert" not in page.text and "<img src=x" not in page.text, path
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text, path
        # The only script a page loads is the dashboard's own file.
        assert re.findall(r"<script[^>]*>", page.text) in (
            [],
            ['<script src="/ui/static/refresh.js" defer>'],
        )


async def test_the_jobs_page_filters_with_the_api_parameters_and_pages_with_its_cursor(api):
    engine = engine_of(api)
    wanted = await add_jobs(engine, 7, queue="pages", status="failed")
    await add_jobs(engine, 3, queue="pages", status="completed")
    await add_jobs(engine, 4, queue="other", status="failed")
    seen: list[str] = []
    # The form sends its empty fields too: they mean "any".
    path = "/ui/jobs?status=failed&type=&queue=pages&limit=3"
    api_path = "/jobs?status=failed&queue=pages&limit=3"
    pages = 0
    while path:
        page = await api.get(path)
        assert page.status_code == 200
        ids = [row[0] for row in table(page.text)[1:]]
        listed = await api.get(api_path)
        # The same page as GET /jobs, in the same order.
        assert ids == [job["id"] for job in listed.json()["jobs"]]
        for job_id in ids:
            assert (job_id, f"/ui/jobs/{job_id}") in links(page.text)
        seen += ids
        pages += 1
        following = [href for text, href in links(page.text) if text == "Next page"]
        cursor = listed.json()["next_cursor"]
        assert bool(following) == (cursor is not None)
        path = "/ui/jobs" + following[0].replace("&amp;", "&") if following else ""
        api_path = f"/jobs?status=failed&queue=pages&limit=3&cursor={cursor}"
    assert pages == 3
    assert seen == sorted(map(str, wanted), reverse=True)


async def test_the_filter_form_uses_the_api_parameter_names_and_shows_the_values_given(api):
    page = (await api.get("/ui/jobs?status=dead_letter&type=sleep&queue=mail")).text
    for name in ("status", "type", "queue"):
        assert re.search(rf'<label for="{name}">', page) and f'name="{name}"' in page
    assert '<option value="dead_letter" selected>' in page
    assert 'name="type" value="sleep"' in page and 'name="queue" value="mail"' in page


@pytest.mark.parametrize(
    "query, message",
    [
        ("status=bogus", "unknown status"),
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("cursor=nope", "cursor"),
        ("queue=Bad%20Queue", "queue"),
        ("color=red", "unknown query parameter"),
        ("queue=a&queue=b", "more than once"),
    ],
)
async def test_a_bad_filter_is_a_400_page_saying_why(api, query, message):
    page = await api.get(f"/ui/jobs?{query}")
    assert page.status_code == 400
    assert message in page.text
    assert 'role="alert"' in page.text


async def test_the_dead_letters_page_lists_only_dead_letters_with_a_retry_button_each(api):
    engine = engine_of(api)
    dead = await add_jobs(engine, 2, status="dead_letter", queue="mail", last_error="timed out")
    await add_jobs(engine, 2, status="failed", queue="mail")
    await add_jobs(engine, 1, status="dead_letter", queue="other")
    page = await api.get("/ui/dead-letters?queue=mail")
    rows = table(page.text)[1:]
    assert [row[0] for row in rows] == sorted(map(str, dead), reverse=True)
    assert all(row[-1] == "Retry" for row in rows)
    assert all(row[-2] == "timed out" for row in rows)
    assert "Retry up to 100 dead letters" in page.text
    # Its status is fixed: the page takes no status parameter.
    assert (await api.get("/ui/dead-letters?status=failed")).status_code == 400


@pytest.mark.parametrize("status", list(Status))
async def test_the_detail_page_shows_the_job_and_only_the_actions_its_status_allows(api, status):
    engine = engine_of(api)
    [job_id] = await add_jobs(
        engine,
        status=status.value,
        queue="detail",
        payload={"to": "ops@example.com"},
        result={"sent": 1} if status is Status.COMPLETED else None,
        last_error="HTTP 503" if status is Status.DEAD_LETTER else None,
    )
    page = await api.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200
    text = page.text
    for field in ("Status", "Type", "Queue", "Priority", "Attempts", "Max attempts"):
        assert f"<dt>{field}</dt>" in text
    for field in ("Created", "Run at", "Finished", "Payload", "Result", "Last error"):
        assert field in text
    assert "ops@example.com" in text
    assert ("sent" in text) == (status is Status.COMPLETED)
    assert ("HTTP 503" in text) == (status is Status.DEAD_LETTER)
    buttons = re.findall(r'<button type="submit"[^>]*>(\w+)</button>', text)
    expected = ["Retry"] * (status in RETRYABLE) + ["Cancel"] * (status in CANCELLABLE)
    assert buttons == expected


def _failed(attempt: int, error: str, traceback: str | None) -> dict[str, object]:
    """An entry of `jobs.errors` as the database writes it."""
    at = f"2026-11-30T04:19:4{attempt}.5+00:00"
    return {"attempt": attempt, "at": at, "error": error, "traceback": traceback}


async def test_the_detail_page_shows_each_failed_attempt_with_its_traceback(api):
    engine = engine_of(api)
    traceback = "Traceback (most recent call last):\n  File \"h.py\", line 3, in run\nKeyError: 'x'"
    [failed, fresh] = [
        *await add_jobs(
            engine,
            status="dead_letter",
            attempts=2,
            last_error="lease expired during attempt 2",
            errors=[
                _failed(1, "KeyError: 'x'", traceback),
                _failed(2, "lease expired during attempt 2", None),
            ],
        ),
        *await add_jobs(engine, status="pending"),
    ]
    text = (await api.get(f"/ui/jobs/{failed}")).text
    section = text[text.index("<h2>Failed attempts</h2>") :]
    # Oldest first, each with its error in the text; a traceback collapsed in <details>
    # (readable without a script: the browser opens it).
    attempts = re.findall(r'<p class="attempt">Attempt (\d), ', section)
    assert attempts == ["1", "2"]
    assert re.findall(r"<details( open)?>\s*<summary>Traceback of attempt (\d)", section) == [
        ("", "1")
    ]
    # Times relative in the text, RFC 3339 in the title.
    assert 'title="2026-11-30T04:19:41.500000Z">' in section
    assert "File &#34;h.py&#34;, line 3, in run" in section  # escaped, as every value is
    assert "KeyError: &#39;x&#39;" in section
    assert "No traceback: nothing raised." in section
    fresh_page = (await api.get(f"/ui/jobs/{fresh}")).text
    assert re.search(r"<h2>Failed attempts</h2>\s*<p>None.</p>", fresh_page)


async def test_the_static_files_come_from_the_package(api):
    css = await api.get("/ui/static/dashboard.css")
    js = await api.get("/ui/static/refresh.js")
    assert css.status_code == js.status_code == 200
    assert css.headers["content-type"].startswith("text/css")
    assert "javascript" in js.headers["content-type"]
    assert "location.reload" in js.text


async def test_a_chart_over_its_time_budget_is_skipped_and_the_queues_still_show(api, monkeypatch):
    engine = engine_of(api)
    await add_jobs(engine, 2, queue="busy")
    async with engine.connect() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO jobqueue.jobs"
                " (id, type, payload, status, attempts, max_attempts, finished_at)"
                " SELECT gen_random_uuid(), 'sleep', '{}'::jsonb, 'completed', 1, 3, now()"
                " FROM generate_series(1, 30000)"
            )
        )
    # 30,000 rows take milliseconds to count; one is not enough.
    monkeypatch.setattr(pages, "CHART_BUDGET_MS", 1)
    page = await api.get("/ui/")
    assert page.status_code == 200
    assert "The chart was skipped" in page.text and "<svg" not in page.text
    assert ["busy", "2", "0", "0", "0"] in [row[:5] for row in table(page.text)]
    # The budget was the chart's transaction's own: the connection went back to the pool
    # (or, through a pooler, to the next client) without it.
    async with engine.connect() as conn:
        assert await conn.scalar(sa.text("SHOW statement_timeout")) == "0"
    monkeypatch.undo()
    assert "<svg" in (await api.get("/ui/")).text
