"""The dashboard's debugging pages in process (the real app on the real database): opening a
job by its id, the types the filter offers, the list's columns, relative times, a job page's
attempts, durations, lease, concurrency key and self-refresh, the schedules page, and each
queue's hour."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from jobcore.ids import new_id
from jobcore.periodic import Schedule, next_tick
from jobcore.schema import job_types, jobs
from jobqueue_api.ui.render import ago, duration
from tests.api.ui.seed import add_jobs, table
from tests.api.ui.test_pages import SCRIPT, _failed, engine_of

RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


async def test_the_search_field_opens_a_job_by_its_id(api):
    [job_id] = await add_jobs(engine_of(api), queue="found")
    page = (await api.get("/ui/jobs")).text
    assert re.search(r'<input id="q" name="q" type="search"', page)
    assert '<label for="q">' in page
    opened = await api.get(f"/ui/jobs?q=%20{job_id}%20")
    assert opened.status_code == 303
    assert opened.headers["location"] == f"/ui/jobs/{job_id}"
    # The id in any case, as the API takes it.
    upper = await api.get(f"/ui/jobs?q={str(job_id).upper()}")
    assert upper.headers["location"] == f"/ui/jobs/{job_id}"


@pytest.mark.parametrize(
    "given",
    [
        "01a22fbe-9723-7ee7-be02-c4f63a9eacea",  # well formed, no such job
        "not-an-id",
        "' OR 1=1 --",
        SCRIPT,
        "x" * 5000,
        "%00",
        "01a22fbe-9723-7ee7-be02-c4f63a9eacea-",
    ],
)
async def test_an_unknown_or_malformed_id_is_a_page_saying_there_is_no_such_job(api, given):
    response = await api.get("/ui/jobs", params={"q": given})
    assert response.status_code == 404
    assert "There is no job" in response.text
    assert response.headers["content-type"].startswith("text/html")
    assert "<script>alert" not in response.text
    # The field is there to try again.
    assert 'name="q"' in response.text


async def test_the_type_filter_offers_the_recorded_and_configured_types(make_api):
    api = await make_api(JOB_TYPES="configured.only")
    async with engine_of(api).begin() as conn:
        await conn.execute(
            job_types.insert().values(
                [
                    {"type": "mail.send", "recorded_by": "w:1"},
                    {"type": SCRIPT, "recorded_by": "w:1"},
                ]
            )
        )
        await conn.execute(
            job_types.insert().values(
                type="long.gone",
                recorded_by="w:2",
                recorded_at=sa.func.now() - sa.text("interval '8 days'"),
            )
        )
    for path in ("/ui/jobs", "/ui/dead-letters"):
        page = (await api.get(path)).text
        assert 'name="type"' in page and 'list="known-types"' in page
        datalist = page[page.index('<datalist id="known-types">') :]
        offered = re.findall(r'<option value="([^"]*)">', datalist[: datalist.index("</datalist>")])
        assert "mail.send" in offered and "configured.only" in offered
        assert "long.gone" not in offered  # no worker refreshed it within 7 days
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in offered


async def test_the_list_shows_priority_run_at_and_the_last_error_truncated(api):
    engine = engine_of(api)
    error = "E" * 70 + " and then " + "x" * 300
    [job_id] = await add_jobs(engine, status="failed", queue="cols", last_error=error)
    async with engine.begin() as conn:
        await conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(priority=7))
    page = (await api.get("/ui/jobs?queue=cols")).text
    header, row = table(page)[:2]
    for column in ("Priority", "Run at", "Last error"):
        assert column in header
    assert row[header.index("Priority")] == "7"
    shown = row[header.index("Last error")]
    assert shown.endswith("…") and len(shown) <= 81 and error.startswith(shown[:-1])
    assert f'title="{error}"' in page
    assert re.search(r'<time datetime="[^"]+" title="[^"]+">(now|\d+ s ago)</time>', page)


def test_times_read_relative_to_now_in_one_format():
    now = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
    cases = {
        timedelta(0): "now",
        timedelta(seconds=-5): "in 5 s",
        timedelta(seconds=45): "45 s ago",
        timedelta(minutes=3, seconds=20): "3 min ago",
        timedelta(minutes=-90): "in 90 min",
        timedelta(hours=5): "5 h ago",
        timedelta(days=3): "3 d ago",
    }
    for delta, text in cases.items():
        assert ago(now - delta, now) == text
    assert ago(None) == "—"
    assert duration(0.42) == "0.4 s" and duration(75) == "1 min"


async def test_every_time_on_every_page_is_relative_with_its_rfc_3339_value_in_title(api):
    engine = engine_of(api)
    [job_id] = await add_jobs(
        engine, status="dead_letter", queue="times", errors=[_failed(1, "boom", "tb")]
    )
    await add_jobs(engine, queue="times", scheduled=True)
    for path in ("/ui/jobs", f"/ui/jobs/{job_id}", "/ui/dead-letters"):
        page = (await api.get(path)).text
        times = re.findall(r"<time ([^>]*)>([^<]*)</time>", page)
        assert times, path
        for attributes, text in times:
            title = re.search(r'title="([^"]+)"', attributes)
            assert title and RFC3339.fullmatch(title.group(1)), attributes
            assert re.fullmatch(r"now|in \d+ (s|min|h|d)|\d+ (s|min|h|d) ago", text), text
        # No absolute time in a table cell's text.
        assert not re.search(r">\s*\d{4}-\d\d-\d\d[ T]\d\d:\d\d", page.replace("title=", "")), path


async def test_a_job_page_refreshes_itself_only_while_the_job_is_unfinished(api):
    engine = engine_of(api)
    for status, refreshes in [
        ("pending", True),
        ("processing", True),
        ("completed", False),
        ("failed", False),
        ("dead_letter", False),
        ("cancelled", False),
    ]:
        [job_id] = await add_jobs(engine, status=status, queue="refresh")
        page = (await api.get(f"/ui/jobs/{job_id}")).text
        marker = re.search(r'id="refresh-while-unfinished" data-refresh-seconds="(\d+)"', page)
        assert bool(marker) == refreshes, status
        if marker:
            assert 1 <= int(marker.group(1)) <= 5
            assert '<script src="/ui/static/refresh.js" defer></script>' in page
        # Never an inline script.
        assert not re.search(r"<script(?![^>]*\bsrc=)", page)


async def test_a_running_job_shows_its_lease_holder_and_expiry_and_how_long_it_ran_and_waited(api):
    engine = engine_of(api)
    [job_id] = await add_jobs(engine, status="processing", attempts=1, queue="lease")
    async with engine.begin() as conn:
        await conn.execute(
            sa.update(jobs)
            .where(jobs.c.id == job_id)
            .values(
                created_at=sa.func.now() - sa.text("interval '90 seconds'"),
                run_at=sa.func.now() - sa.text("interval '90 seconds'"),
                updated_at=sa.func.now() - sa.text("interval '30 seconds'"),
                leased_by="worker-7.example:4242",
            )
        )
    page = (await api.get(f"/ui/jobs/{job_id}")).text
    lease = re.search(r'<div class="lease"><dt>Lease</dt><dd>(.*?)</dd>', page)
    assert lease and re.search(r'expires <time [^>]*title="[^"]+">in [45] min</time>', lease[1])
    assert 'held by <span class="leased-by">worker-7.example:4242</span>' in lease[1]
    fields = dict(re.findall(r'<dt>([^<]+)</dt><dd class="duration">([^<]+)</dd>', page))
    assert fields["Running for"] in ("30 s", "31 s")
    assert fields["Waited before this attempt"] in ("1 min", "59 s")
    assert fields["So far"] in ("1 min",)


async def test_a_job_page_shows_its_concurrency_key_when_it_has_one(api):
    engine = engine_of(api)
    keyed, plain = await add_jobs(engine, 2, queue="keys")
    async with engine.begin() as conn:
        await conn.execute(
            sa.update(jobs).where(jobs.c.id == keyed).values(concurrency_key="tenant <7> & co")
        )
    page = (await api.get(f"/ui/jobs/{keyed}")).text
    assert (
        '<div><dt>Concurrency key</dt><dd class="concurrency-key">tenant &lt;7&gt; &amp; co</dd>'
        in page
    )
    assert "Concurrency key" not in (await api.get(f"/ui/jobs/{plain}")).text


async def _record_schedule(engine, name: str, cron: str, type_: str, **options) -> None:
    entry = {"name": name, "cron": cron, "payload": {}, **options}
    async with engine.begin() as conn:
        await conn.execute(
            job_types.insert().values(
                type=type_,
                recorded_by="worker-host:4242",
                schedules=[entry],
                options={"queue": "reports"},
            )
        )


async def test_the_schedules_page_lists_each_recorded_schedule_with_its_next_tick_and_job(api):
    engine = engine_of(api)
    await _record_schedule(engine, "nightly-report", "0 3 * * *", "report.nightly")
    await _record_schedule(engine, "every-10s", "*/10 * * * * *", "tick", queue="ticks")
    now = datetime.now(UTC)
    # The job the last tick of every-10s created (found by its key).
    schedule = Schedule("every-10s", "*/10 * * * * *", "tick", {})
    last = schedule.key(schedule.last_tick(now))
    made = new_id()
    async with engine.begin() as conn:
        await conn.execute(
            jobs.insert().values(
                id=made,
                type="tick",
                payload={},
                max_attempts=3,
                queue="ticks",
                idempotency_key=last,
            )
        )
    page = await api.get("/ui/schedules")
    assert page.status_code == 200
    rows = table(page.text)
    assert rows[0][:6] == ["Name", "Cron", "Type", "Queue", "Next tick", "Last job created"]
    by_name = {row[0]: row for row in rows[1:]}
    assert by_name["every-10s"][1:4] == ["*/10 * * * * *", "tick", "ticks"]
    # Its queue from the recorded handler options when the schedule names none.
    assert by_name["nightly-report"][1:4] == ["0 3 * * *", "report.nightly", "reports"]
    assert str(made) in by_name["every-10s"][5]
    assert "none found" in by_name["nightly-report"][5]
    ticks = re.findall(
        r'<td data-label="Next tick" class="next-tick"><time [^>]*title="([^"]+)"', page.text
    )
    expected = {
        next_tick("0 3 * * *", now),
        next_tick("*/10 * * * * *", now),
    }
    parsed = {datetime.fromisoformat(t.replace("Z", "+00:00")) for t in ticks}
    assert len(parsed) == 2 and all(
        min(abs((p - e).total_seconds()) for e in expected) <= 10 for p in parsed
    )
    # Every page links to it.
    for path in ("/ui/", "/ui/jobs", "/ui/dead-letters", "/ui/schedules"):
        assert '<a href="/ui/schedules"' in (await api.get(path)).text


async def test_the_schedules_page_without_schedules_says_so(api):
    page = await api.get("/ui/schedules")
    assert page.status_code == 200 and "No schedule recorded" in page.text


async def test_each_queue_s_hour_counts_its_finished_jobs_and_its_oldest_waiting_job(api):
    engine = engine_of(api)
    await add_jobs(engine, 4, queue="hour-a", status="completed", finished_minutes_ago=10)
    await add_jobs(engine, 2, queue="hour-b", status="failed", finished_minutes_ago=3)
    [waiting] = await add_jobs(engine, queue="hour-b")
    async with engine.begin() as conn:
        await conn.execute(
            sa.update(jobs)
            .where(jobs.c.id == waiting)
            .values(run_at=sa.func.now() - sa.text("interval '20 minutes'"))
        )
    page = (await api.get("/ui/")).text
    rows = {row[0]: row for row in table(page, 1)[1:]}
    assert set(rows) == {"hour-a", "hour-b"}
    assert "4 in the hour" in rows["hour-a"][1]
    assert "2 in the hour" in rows["hour-b"][1]
    assert re.search(r"now 20 min", rows["hour-b"][2])
    assert "now 0.0 s" in rows["hour-a"][2]
