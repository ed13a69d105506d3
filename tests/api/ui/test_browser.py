"""The dashboard in headless Chromium (Debian's `chromium`, driven by Playwright) against a
real `jobqueue-api` process with API_TOKENS set, on a database of this module's own.

One browser and one API process serve the whole module; each test opens its own browser
context (cookies of its own) and writes jobs in queues of its own. Every page a test opens
is checked for console errors (a Content-Security-Policy violation is one) and dialogs
(`alert`). Screenshots land in test-artifacts/ui/.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from tests import pg
from tests.api.ui.seed import add_jobs_sync
from tests.e2e.periodic_schedules import NAME as PERIODIC_NAME
from tests.e2e.test_api_process import Api
from tests.procs import wait_for
from tests.worker.support import start_worker

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("ui_browser")]

TOKEN = "browser-test-token-7c1f"
ARTIFACTS = pg.ROOT / "test-artifacts" / "ui"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
# Playwright waits at most this long for a page or an element (the machine is shared).
WAIT_MS = 15_000


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail(
            "the browser tests need Debian's chromium (not found on PATH): run "
            "`bash scripts/install-test-tools.sh` (CI installs it); never `playwright install`",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="module")
def database(pg_server: str, pg_template: str) -> Iterator[str]:
    name = pg.create_database(pg_server, pg_template)
    try:
        yield pg.with_database(pg_server, name)
    finally:
        pg.drop_database(pg_server, name)


@pytest.fixture(scope="module")
def db(database: str) -> Iterator[sa.Engine]:
    """A synchronous engine on the module's database (Playwright's sync API owns the event
    loop of this thread while it runs)."""
    engine = sa.create_engine(make_url(database).set(drivername="postgresql+psycopg"))
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def server(database: str) -> Iterator[Api]:
    api = Api(database, API_TOKENS=TOKEN)
    try:
        api.wait_ready()
        yield api
    finally:
        if api.service.proc.poll() is None:
            api.service.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            yield launched
        finally:
            launched.close()


class Watched:
    """A browser page, and the console errors, page errors and dialogs seen on it."""

    def __init__(self, page: Any, base: str) -> None:
        self.page = page
        self.base = base
        self.problems: list[str] = []
        self.expected: list[str] = []
        page.set_default_timeout(WAIT_MS)
        page.on(
            "console",
            lambda m: (
                self.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None
            ),
        )
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))

        def dialog(d: Any) -> None:
            self.problems.append(f"dialog {d.type}: {d.message}")
            d.dismiss()

        page.on("dialog", dialog)

    def expect_refusal(self, status: int) -> None:
        """The test provokes a page answered `status`: Chromium logs that as an error."""
        self.expected.append(f"the server responded with a status of {status} ")

    def unexpected(self) -> list[str]:
        return [p for p in self.problems if not any(e in p for e in self.expected)]

    def open(self, path: str) -> Any:
        response = self.page.goto(self.base + path)
        assert response is not None
        return response

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _sign_in(watched: Watched, token: str = TOKEN) -> None:
    watched.page.get_by_label("Token").fill(token)
    watched.page.get_by_role("button", name="Sign in").click()


@pytest.fixture(scope="module")
def session_state(browser: Any, server: Api) -> dict[str, Any]:
    """Cookies of a browser signed in through the form, for the tests' contexts."""
    context = browser.new_context(viewport=DESKTOP)
    try:
        watched = Watched(context.new_page(), server.base)
        watched.open("/ui/")
        _sign_in(watched)
        watched.page.wait_for_url(server.base + "/ui/")
        state: dict[str, Any] = context.storage_state()
        return state
    finally:
        context.close()


def _open_page(browser: Any, server: Api, state: dict[str, Any] | None, viewport: dict) -> Any:
    context = browser.new_context(viewport=viewport, storage_state=state)
    # The pages' timers stand still unless a test moves them (the queues page reloads
    # itself every 10 s: never in the middle of a test's checks).
    context.clock.install()
    context.clock.pause_at(datetime.now(UTC) + timedelta(seconds=1))
    return context, Watched(context.new_page(), server.base)


@pytest.fixture
def ui(browser: Any, server: Api, session_state: dict[str, Any]) -> Iterator[Watched]:
    """A signed-in page at desktop size; no console error or dialog may occur on it."""
    context, watched = _open_page(browser, server, session_state, DESKTOP)
    try:
        yield watched
    finally:
        context.close()
    assert watched.unexpected() == []


@pytest.fixture
def phone(browser: Any, server: Api, session_state: dict[str, Any]) -> Iterator[Watched]:
    context, watched = _open_page(browser, server, session_state, PHONE)
    try:
        yield watched
    finally:
        context.close()
    assert watched.unexpected() == []


@pytest.fixture
def anonymous(browser: Any, server: Api) -> Iterator[Watched]:
    """A page of a browser that has not signed in."""
    context, watched = _open_page(browser, server, None, DESKTOP)
    try:
        yield watched
    finally:
        context.close()
    assert watched.unexpected() == []


def api_get(server: Api, path: str) -> Any:
    response = httpx.get(
        server.base + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    )
    assert response.status_code == 200, response.text
    return response.json()


# --- tests -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def landscape(db: sa.Engine) -> dict[str, list[Any]]:
    """A few queues at work, and jobs finished over the last hour (the screenshots' data)."""
    made: dict[str, list[Any]] = {}
    for queue, pending, scheduled, running, dead in [
        ("default", 42, 6, 3, 2),
        ("emails", 310, 0, 8, 17),
        ("reports", 5, 24, 1, 0),
    ]:
        made[queue] = add_jobs_sync(db, pending, queue=queue)
        add_jobs_sync(db, scheduled, queue=queue, scheduled=True)
        add_jobs_sync(db, running, queue=queue, status="processing", attempts=1)
        add_jobs_sync(db, dead, queue=queue, status="dead_letter", last_error="HTTP 503")
    for minute in range(0, 60):
        # A working hour: a steady flow with a burst, a few failures and dead letters.
        steady = 20 + (minute * 7) % 13 + (25 if 18 <= minute <= 24 else 0)
        add_jobs_sync(db, steady, status="completed", finished_minutes_ago=minute + 0.5)
        if minute % 6 == 0:
            add_jobs_sync(db, 2 + minute % 4, status="failed", finished_minutes_ago=minute + 0.5)
        if minute % 15 == 3:
            add_jobs_sync(db, 3, status="dead_letter", finished_minutes_ago=minute + 0.5)
    return made


def _no_overflow(watched: Watched) -> None:
    overflow = watched.page.evaluate(
        "() => [document.documentElement.scrollWidth, window.innerWidth]"
    )
    assert overflow[0] <= overflow[1], f"the page is wider than the viewport: {overflow}"


def _accessible(watched: Watched) -> None:
    """Landmarks, a label for every control, and scoped table headers."""
    page = watched.page
    for landmark in ("banner", "navigation", "main"):
        assert page.get_by_role(landmark).count() >= 1, landmark
    unlabelled = page.evaluate(
        """() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
                .filter(el => el.labels.length === 0).map(el => el.outerHTML)"""
    )
    assert unlabelled == []
    unscoped = page.evaluate(
        "() => [...document.querySelectorAll('th:not([scope])')].map(th => th.outerHTML)"
    )
    assert unscoped == []


def test_every_page_links_to_jobs_and_reads_well_on_a_desktop_and_a_phone(
    ui, phone, landscape, server
):
    dead = landscape["emails"][0]
    pages = {
        "queues": "/ui/",
        "jobs": "/ui/jobs",
        "job": f"/ui/jobs/{dead}",
        "dead-letters": "/ui/dead-letters",
    }
    for name, path in pages.items():
        for watched, size in ((ui, "desktop"), (phone, "phone")):
            assert watched.open(path).status == 200, path
            jobs_link = watched.page.get_by_role("link", name="Jobs", exact=True)
            assert jobs_link.get_attribute("href") == "/ui/jobs"
            _accessible(watched)
            _no_overflow(watched)
            watched.shot(f"{name}-{size}")
    ui.open("/ui/")
    ui.page.get_by_role("link", name="Jobs", exact=True).click()
    ui.page.wait_for_url(server.base + "/ui/jobs")


def test_the_queues_page_is_one_row_per_queue_with_a_chart_of_the_last_hour(ui, landscape, server):
    ui.open("/ui/")
    rows = ui.page.locator("table.queues tbody tr")
    depths = api_get(server, "/queues")["queues"]
    assert rows.count() == len(depths) >= 3
    for index, depth in enumerate(depths):
        cells = rows.nth(index).locator("th, td").all_inner_texts()
        assert cells[0] == depth["queue"]
        numbers = [int(c.replace(",", "")) for c in cells[1:5]]
        assert numbers == [depth[k] for k in ("pending", "scheduled", "processing", "dead_letter")]
    chart = ui.page.get_by_role("img", name="Jobs finished per minute, last hour")
    assert chart.is_visible()
    assert ui.page.locator("svg rect.bar").count() >= 60
    # The script is the page's own file, allowed by the policy: it shows its box.
    assert ui.page.get_by_label("Refresh every 10 seconds").is_visible()
    ui.shot("queues")


def test_the_queues_page_refreshes_itself_every_10_seconds_while_its_box_is_ticked(ui, db):
    ui.open("/ui/")
    box = ui.page.get_by_label("Refresh every 10 seconds")
    assert box.is_checked()
    add_jobs_sync(db, queue="appears")
    assert ui.page.get_by_role("link", name="appears", exact=True).count() == 0
    ui.page.clock.run_for(10_500)
    ui.page.get_by_role("link", name="appears", exact=True).wait_for()
    ui.page.get_by_label("Refresh every 10 seconds").uncheck()
    add_jobs_sync(db, queue="stays-unseen")
    ui.page.clock.run_for(60_000)
    assert ui.page.get_by_role("link", name="stays-unseen", exact=True).count() == 0
    # The choice is kept for the next visit.
    ui.open("/ui/")
    assert not ui.page.get_by_label("Refresh every 10 seconds").is_checked()


def test_filtering_and_paging_show_every_matching_job_once(ui, db, server):
    made = add_jobs_sync(db, 45, queue="paging", status="failed")
    add_jobs_sync(db, 5, queue="paging", status="completed")
    ui.open("/ui/jobs")
    ui.page.get_by_label("Status").select_option("failed")
    ui.page.get_by_label("Queue").fill("paging")
    ui.page.get_by_label("Per page").select_option("20")
    ui.page.get_by_role("button", name="Filter").click()
    ui.page.wait_for_url("**/ui/jobs?status=failed*queue=paging*")
    seen: list[str] = []
    pages = 0
    while True:
        pages += 1
        ids = ui.page.locator("table.jobs tbody th a").all_inner_texts()
        for job_id in ids:
            assert ui.page.get_by_role("link", name=job_id).get_attribute("href") == (
                f"/ui/jobs/{job_id}"
            )
        seen += ids
        following = ui.page.get_by_role("link", name="Next page")
        if following.count() == 0:
            break
        following.click()
        ui.page.wait_for_load_state()
    assert pages == 3
    assert seen == sorted(map(str, made), reverse=True)
    ui.shot("jobs-filtered-last-page")


def test_a_dead_letter_is_retried_from_its_detail_page(ui, db, server):
    [job_id] = add_jobs_sync(db, status="dead_letter", queue="retry-one", last_error="timeout")
    ui.open("/ui/dead-letters?queue=retry-one")
    ui.page.get_by_role("link", name=str(job_id)).click()
    ui.page.wait_for_url(f"**/ui/jobs/{job_id}")
    ui.page.get_by_role("button", name="Retry", exact=True).click()
    ui.page.get_by_role("status").wait_for()
    assert "retried" in ui.page.get_by_role("status").inner_text()
    job = api_get(server, f"/jobs/{job_id}")
    assert (job["status"], job["attempts"]) == ("pending", 0)
    ui.shot("job-retried")


def test_a_pending_job_is_cancelled_from_its_detail_page(ui, db, server):
    [job_id] = add_jobs_sync(db, queue="cancel-one", payload={"to": "ops@example.com"})
    ui.open(f"/ui/jobs/{job_id}")
    assert ui.page.get_by_role("button", name="Retry", exact=True).count() == 0
    ui.page.get_by_role("button", name="Cancel", exact=True).click()
    ui.page.get_by_role("status").wait_for()
    assert api_get(server, f"/jobs/{job_id}")["status"] == "cancelled"
    # Cancelled: retry is offered now, cancel no more.
    assert ui.page.get_by_role("button", name="Retry", exact=True).count() == 1
    assert ui.page.get_by_role("button", name="Cancel", exact=True).count() == 0


def test_dead_letters_are_retried_in_one_click_each_or_in_bulk(ui, db, server):
    ids = add_jobs_sync(db, 3, status="dead_letter", queue="bulk-ui")
    ui.open("/ui/dead-letters?queue=bulk-ui")
    newest = sorted(map(str, ids), reverse=True)
    row = ui.page.locator("table.jobs tbody tr", has_text=newest[0])
    row.get_by_role("button", name="Retry", exact=True).click()
    ui.page.get_by_role("status").wait_for()
    assert api_get(server, f"/jobs/{newest[0]}")["status"] == "pending"
    # Back on the dead letters page, with its filter: the other two are left.
    assert ui.page.locator("table.jobs tbody th a").all_inner_texts() == newest[1:]
    ui.page.get_by_role("button", name="Retry up to 100 dead letters").click()
    ui.page.get_by_role("status").wait_for()
    assert "Retried 2 of 2" in ui.page.get_by_role("status").inner_text()
    assert {api_get(server, f"/jobs/{i}")["status"] for i in ids} == {"pending"}


def test_an_action_without_its_csrf_token_is_refused_and_changes_nothing(ui, db, server):
    [job_id] = add_jobs_sync(db, status="dead_letter", queue="csrf-ui")
    ui.expect_refusal(403)
    ui.open(f"/ui/jobs/{job_id}")
    # A POST from this signed-in browser, without the form's token.
    refused = ui.page.request.post(f"{server.base}/ui/jobs/{job_id}/retry", form={})
    assert refused.status == 403
    # The form itself, its token taken out before the click.
    ui.page.evaluate(
        "() => document.querySelectorAll('input[name=csrf_token]').forEach(el => el.remove())"
    )
    ui.page.get_by_role("button", name="Retry", exact=True).click()
    ui.page.wait_for_load_state()
    assert "nothing was done" in ui.page.locator("main").inner_text()
    assert api_get(server, f"/jobs/{job_id}")["status"] == "dead_letter"


def test_a_script_in_a_job_is_shown_as_text_and_never_runs(ui, db, server):
    script = "<script>alert(1)</script>"
    [job_id] = add_jobs_sync(
        db,
        status="dead_letter",
        queue="xss",
        payload={"note": script},
        last_error='<img src=x onerror="alert(2)">',
    )
    for path in (f"/ui/jobs/{job_id}", "/ui/dead-letters?queue=xss", "/ui/jobs?queue=xss"):
        ui.open(path)
        ui.page.wait_for_load_state("load")
        assert ui.page.locator("main img").count() == 0
        assert ui.page.locator("main script").count() == 0
    ui.open(f"/ui/jobs/{job_id}")
    assert script in ui.page.locator("pre.payload").inner_text()
    assert ui.page.get_by_text('<img src=x onerror="alert(2)">').first.is_visible()
    ui.shot("job-with-script-payload")
    # The `ui` fixture then checks that no dialog opened and no console error was logged.


def test_signing_in_and_out(anonymous, server):
    anonymous.open("/ui/jobs?queue=mail")
    anonymous.page.wait_for_url("**/ui/sign-in?next=*")
    token_field = anonymous.page.get_by_label("Token")
    assert token_field.get_attribute("type") == "password"
    anonymous.shot("sign-in")
    anonymous.expect_refusal(401)
    _sign_in(anonymous, "not-the-token")
    assert "not one of API_TOKENS" in anonymous.page.get_by_role("alert").inner_text()
    assert not [c for c in anonymous.page.context.cookies() if c["name"] == "jobqueue_session"]
    _sign_in(anonymous)
    anonymous.page.wait_for_url(server.base + "/ui/jobs?queue=mail")
    [session] = [c for c in anonymous.page.context.cookies() if c["name"] == "jobqueue_session"]
    assert session["httpOnly"] is True
    assert session["sameSite"] == "Strict"
    assert session["path"] == "/ui"
    assert TOKEN not in session["value"]
    # Not readable by a script of the page.
    assert "jobqueue_session" not in anonymous.page.evaluate("() => document.cookie")
    anonymous.page.get_by_role("button", name="Sign out").click()
    anonymous.page.wait_for_url("**/ui/sign-in")
    assert not [c for c in anonymous.page.context.cookies() if c["name"] == "jobqueue_session"]
    anonymous.open("/ui/")
    anonymous.page.wait_for_url("**/ui/sign-in?next=*")


def test_another_page_cannot_frame_the_dashboard(browser, server):
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        # /healthz sends no framing headers: it shows, so a frame that stays empty was refused.
        page.set_content(
            f'<iframe src="{server.base}/healthz" title="health"></iframe>'
            f'<iframe src="{server.base}/ui/sign-in" title="dashboard"></iframe>',
            wait_until="load",
        )
        assert '"ok"' in page.frame_locator('iframe[title="health"]').locator("body").inner_text()
        # Chromium refuses to show it (X-Frame-Options: DENY, frame-ancestors 'none').
        dashboard = page.frame_locator('iframe[title="dashboard"]')
        assert dashboard.get_by_label("Token").count() == 0
    finally:
        context.close()


# --- debugging -------------------------------------------------------------------------------


def test_a_job_is_opened_by_its_id_and_an_unknown_id_says_there_is_no_such_job(ui, db, server):
    [job_id] = add_jobs_sync(db, queue="search-ui")
    ui.open("/ui/jobs")
    ui.page.get_by_label("Open a job by its id").fill(str(job_id))
    ui.page.get_by_role("button", name="Open", exact=True).click()
    ui.page.wait_for_url(f"**/ui/jobs/{job_id}")
    assert str(job_id) in ui.page.get_by_role("heading", level=1).inner_text()
    ui.expect_refusal(404)
    for unknown in ("01a22fbe-9723-7ee7-be02-c4f63a9eacea", "not an id"):
        ui.open("/ui/jobs")
        ui.page.get_by_label("Open a job by its id").fill(unknown)
        ui.page.get_by_role("button", name="Open", exact=True).click()
        ui.page.get_by_role("alert").wait_for()
        assert "There is no job" in ui.page.get_by_role("alert").inner_text()
    ui.shot("jobs-no-such-job")


def test_the_attempts_show_their_tracebacks_collapsed_and_a_script_in_one_is_inert(ui, db):
    traceback = (
        'Traceback (most recent call last):\n  File "h.py", line 3\n'
        "ValueError: <script>alert(3)</script>"
    )
    errors = [
        {
            "attempt": 1,
            "at": "2026-12-02T10:00:00+00:00",
            "error": "ValueError: bad",
            "traceback": traceback,
        },
        {
            "attempt": 2,
            "at": "2026-12-02T10:01:00+00:00",
            "error": "lease expired",
            "traceback": None,
        },
    ]
    [job_id] = add_jobs_sync(
        db, status="dead_letter", queue="attempts-ui", errors=errors, last_error="lease expired"
    )
    ui.open(f"/ui/jobs/{job_id}")
    shown = ui.page.locator("pre.traceback")
    assert shown.count() == 1 and not shown.is_visible()  # collapsed
    ui.page.get_by_text("Traceback of attempt 1").click()
    assert shown.is_visible()
    assert "ValueError: <script>alert(3)</script>" in shown.inner_text()
    assert ui.page.locator("main script").count() == 0
    assert ui.page.get_by_text("No traceback: nothing raised.").is_visible()
    ui.shot("job-attempts")
    # The `ui` fixture then checks that no dialog opened.


def test_a_job_page_refreshes_itself_until_the_job_is_completed(ui, db):
    [job_id] = add_jobs_sync(db, status="processing", attempts=1, queue="refresh-ui")
    loads: list[str] = []
    ui.page.on("load", lambda: loads.append("load"))
    ui.open(f"/ui/jobs/{job_id}")
    assert ui.page.locator("dl.fields .status").inner_text() == "processing"
    assert ui.page.get_by_text("refreshes every").is_visible()
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobqueue.jobs SET status = 'completed', locked_until = NULL,"
                " finished_at = now(), result = '{\"ok\": true}' WHERE id = :id"
            ),
            {"id": job_id},
        )
    # At most 5 s later the page shows it.
    ui.page.clock.run_for(5_000)
    ui.page.locator("dl.fields .status", has_text="completed").wait_for()
    count = len(loads)
    ui.page.clock.run_for(60_000)
    assert len(loads) == count  # finished: no more reloads
    assert ui.page.get_by_text("refreshes every").count() == 0


def test_the_schedules_page_lists_a_recorded_schedule(ui, db):
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO jobqueue.job_types (type, recorded_by, schedules)"
                " VALUES ('browser.report', 'host:77', :s)"
                " ON CONFLICT (type) DO UPDATE SET schedules = excluded.schedules"
            ),
            {"s": '[{"name": "browser-5m", "cron": "*/5 * * * *", "payload": {}}]'},
        )
    ui.open("/ui/")
    ui.page.get_by_role("link", name="Schedules", exact=True).click()
    ui.page.wait_for_url("**/ui/schedules")
    row = ui.page.locator("table.schedules tbody tr", has_text="browser-5m")
    assert "*/5 * * * *" in row.inner_text() and "browser.report" in row.inner_text()
    title = row.locator("td.next-tick time").get_attribute("title")
    assert title is not None and title.endswith("Z")
    ui.shot("schedules")


def test_the_new_pages_fit_a_desktop_and_a_phone_and_the_phone_list_shows_id_status_type(
    ui, phone, landscape
):
    dead = landscape["emails"][0]
    for watched, size in ((ui, "desktop"), (phone, "phone")):
        for name, path in (("schedules", "/ui/schedules"), ("jobs-list", "/ui/jobs")):
            assert watched.open(path).status == 200
            _accessible(watched)
            _no_overflow(watched)
            watched.shot(f"{name}-{size}")
        watched.open(f"/ui/jobs/{dead}")
        _no_overflow(watched)
    phone.open("/ui/jobs")
    first = phone.page.locator("table.jobs tbody tr").first
    width = phone.page.evaluate("() => window.innerWidth")
    for part in ("th a.id", ".status", "td.type"):
        box = first.locator(part).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, part


def test_selected_jobs_are_retried_and_cancelled_in_bulk_checked_over_http(ui, db, server):
    dead = add_jobs_sync(db, 2, status="dead_letter", queue="bulk-select")
    [done] = add_jobs_sync(db, status="completed", queue="bulk-select")
    pending = add_jobs_sync(db, 2, queue="bulk-select")
    ui.open("/ui/jobs?queue=bulk-select")
    for job_id in [*dead, done]:
        ui.page.get_by_label(f"Select job {job_id}").check()
    ui.page.get_by_role("button", name="Retry selected").click()
    ui.page.get_by_role("status").wait_for()
    notice = ui.page.get_by_role("status").inner_text()
    assert "Retried 2 of 3" in notice and "1 left as they were" in notice
    assert [api_get(server, f"/jobs/{i}")["status"] for i in dead] == ["pending", "pending"]
    assert api_get(server, f"/jobs/{done}")["status"] == "completed"
    for job_id in [*pending, done]:
        ui.page.get_by_label(f"Select job {job_id}").check()
    ui.page.get_by_role("button", name="Cancel selected").click()
    ui.page.get_by_role("status").wait_for()
    notice = ui.page.get_by_role("status").inner_text()
    assert "Cancelled 2 of 3" in notice and "1 left as they were" in notice
    assert [api_get(server, f"/jobs/{i}")["status"] for i in pending] == ["cancelled"] * 2
    assert api_get(server, f"/jobs/{done}")["status"] == "completed"
    ui.shot("jobs-bulk")


def test_a_queue_is_paused_and_resumed_from_its_row_checked_over_http(ui, db, server):
    add_jobs_sync(db, queue="pause-ui")

    def paused() -> bool:
        rows = [q for q in api_get(server, "/queues")["queues"] if q["queue"] == "pause-ui"]
        return bool(rows[0]["paused"])

    ui.open("/ui/")
    row = ui.page.locator("table.queues tbody tr", has_text="pause-ui")
    row.get_by_role("button", name="Pause", exact=True).click()
    ui.page.wait_for_load_state()
    ui.page.locator("table.queues tbody tr", has_text="pause-ui").get_by_role(
        "button", name="Resume", exact=True
    ).wait_for()
    assert paused()
    ui.shot("queues-paused")
    ui.page.locator("table.queues tbody tr", has_text="pause-ui").get_by_role(
        "button", name="Resume", exact=True
    ).click()
    ui.page.locator("table.queues tbody tr", has_text="pause-ui").get_by_role(
        "button", name="Pause", exact=True
    ).wait_for()
    assert not paused()


def test_a_real_workers_schedule_is_listed_and_its_running_job_is_followed_to_completed(
    ui, database, server, tmp_path
):
    """A real worker records its schedule (tests/e2e/periodic_schedules.py) and runs a job;
    the pages show both as the worker leaves them, with the page's clock running for real."""
    worker = start_worker(
        database,
        tmp_path,
        JOB_HANDLERS="tests.worker.handlers,tests.e2e.periodic_schedules",
        QUEUES="worker-ui",
    )
    try:

        def submitted() -> str | None:
            answer = httpx.post(
                server.base + "/jobs",
                json={"type": "test.sleep_sync", "queue": "worker-ui", "payload": {"seconds": 4}},
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=10,
            )
            return str(answer.json()["id"]) if answer.status_code == 201 else None

        job_id = wait_for(submitted, 60, "the API to accept the worker's type")
        wait_for(
            lambda: api_get(server, f"/jobs/{job_id}")["status"] == "processing" or None,
            60,
            "the worker to start the job",
        )
        ui.page.clock.resume()
        ui.open(f"/ui/jobs/{job_id}")
        assert ui.page.locator("dl.fields .status").inner_text() == "processing"
        # The worker process running it holds the lease, named as an operator finds it.
        holders = {f"{socket.gethostname()}:{pid}" for pid in worker.child_pids()}
        assert ui.page.locator("dl.fields .lease .leased-by").inner_text() in holders
        # The page reloads itself until it shows what the worker wrote.
        ui.page.locator("dl.fields .status", has_text="completed").wait_for(timeout=30_000)
        last_run_by = ui.page.locator("dl.fields .lease", has_text="Last run by")
        assert last_run_by.locator(".leased-by").inner_text() in holders
        assert api_get(server, f"/jobs/{job_id}")["status"] == "completed"
        assert ui.page.get_by_text("refreshes every").count() == 0

        ui.open("/ui/schedules")
        row = ui.page.locator("table.schedules tbody tr", has_text=PERIODIC_NAME)
        row.wait_for()
        assert "test.record" in row.inner_text()
        assert row.locator("td.next-tick time").get_attribute("title") is not None
        ui.shot("schedules-real-worker")
    finally:
        assert worker.stop(30) == 0
