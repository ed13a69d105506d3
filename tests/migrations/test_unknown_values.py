"""Readers tolerate what a later release writes (docs/upgrading.md, "New statuses and
fields"): during the rollout to a release that adds a job status or a field, this release's
API, dashboard and client show the job as it is instead of failing on it.

A later release would add a status the way 0005 added `cancelled`: its migration widens
the status CHECK constraint, then its services write the new value. The test does the
same to its own database (the constraint is what keeps this release's writers from ever
storing a status they do not know; widening it is what the later migration does), adds a
column the later release would add, and puts a job in the new status through it. The
0004 release's API answered 500 for every job `cancelled` during the rollout to 0005.
"""

from __future__ import annotations

import json
from uuid import UUID

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore.client import render
from jobcore.client.records import Job
from jobcore.ids import new_id
from jobcore.states import FINISHED, Operation, Status
from jobqueue_api.state import state_of
from tests.api.conftest import api, app_of, make_api  # noqa: F401 (fixtures)

LATER = "paused"  # a status a later release might add


async def _a_later_release_wrote(engine: AsyncEngine) -> UUID:
    """The later release's migration (status check widened, a column added), then a job it
    put in its new status, in the queue `mail`."""
    known = ", ".join(f"'{s.value}'" for s in Status)
    job_id = new_id()
    async with engine.begin() as conn:
        await conn.execute(sa.text("ALTER TABLE jobqueue.jobs DROP CONSTRAINT jobs_status_check"))
        await conn.execute(
            sa.text(
                "ALTER TABLE jobqueue.jobs ADD CONSTRAINT jobs_status_check"
                f" CHECK (status IN ({known}, '{LATER}'))"
            )
        )
        await conn.execute(sa.text("ALTER TABLE jobqueue.jobs ADD COLUMN paused_until timestamptz"))
        await conn.execute(
            sa.text(
                "INSERT INTO jobqueue.jobs"
                " (id, type, payload, status, max_attempts, queue, paused_until)"
                " VALUES (:id, 'sleep', '{}', :status, 3, 'mail', now() + interval '1 hour')"
            ),
            {"id": job_id, "status": LATER},
        )
    return job_id


async def test_the_api_answers_a_job_in_a_status_it_does_not_know_as_it_is(api):  # noqa: F811
    job_id = await _a_later_release_wrote(state_of(app_of(api)).engine)
    one = await api.get(f"/jobs/{job_id}")
    assert one.status_code == 200, one.text
    assert one.json()["status"] == LATER and one.json()["id"] == str(job_id)
    assert "paused_until" not in one.json()  # a field it does not know is not its to show
    status = await api.get(f"/jobs/{job_id}/status")
    assert status.status_code == 200 and status.json()["status"] == LATER
    waited = await api.get(f"/jobs/{job_id}?wait=0.2")  # not finished for this release
    assert waited.status_code == 200 and waited.json()["status"] == LATER
    listed = await api.get("/jobs")
    assert listed.status_code == 200, listed.text
    assert [(j["id"], j["status"]) for j in listed.json()["jobs"]] == [(str(job_id), LATER)]
    # A list by queue or type reads one branch per status this release knows: it answers,
    # without the job (docs/upgrading.md).
    by_queue = await api.get("/jobs?queue=mail")
    assert by_queue.status_code == 200 and by_queue.json()["jobs"] == []
    # What a request asks for is still checked against what this release knows.
    asked = await api.get(f"/jobs?status={LATER}")
    assert asked.status_code == 400 and "unknown status" in asked.json()["error"]
    # No operation starts from a status this release does not know: refused, not failed.
    for action in ("retry", "cancel"):
        refused = await api.post(f"/jobs/{job_id}/{action}")
        assert refused.status_code == 409, refused.text
        assert LATER in refused.json()["error"]
    queues = await api.get("/queues")
    assert queues.status_code == 200


async def test_the_dashboard_shows_a_job_in_a_status_it_does_not_know_as_it_is(api):  # noqa: F811
    job_id = await _a_later_release_wrote(state_of(app_of(api)).engine)
    page = await api.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200, page.text
    assert f'<span class="status {LATER}">{LATER}</span>' in page.text
    assert f"/jobs/{job_id}/retry" not in page.text  # no action starts from it
    assert f"/jobs/{job_id}/cancel" not in page.text
    listing = await api.get("/ui/jobs")
    assert listing.status_code == 200 and f">{LATER}</span>" in listing.text
    assert (await api.get("/ui/")).status_code == 200


async def test_the_client_reads_a_job_in_a_status_it_does_not_know_as_it_is(api, capsys):  # noqa: F811
    job_id = await _a_later_release_wrote(state_of(app_of(api)).engine)
    answered = (await api.get(f"/jobs/{job_id}")).json()
    # ... and a field of the later release's API it does not know.
    data = {**answered, "paused_until": "2026-12-01T12:00:00.000000Z"}
    record = Job.from_json(data)
    assert record.status == LATER and record.status.value == LATER
    assert not record.finished  # `wait` goes on waiting, as for any unfinished job
    assert record.raw["paused_until"] == data["paused_until"]
    render.job(record)
    render.jobs([record], more=False)
    assert LATER in capsys.readouterr().out


def test_reading_a_status_it_does_not_know_loosens_no_check():
    """`Status.read` is for what was stored or answered; input still goes through
    `Status(...)`, which refuses a value it does not know."""
    with pytest.raises(ValueError):
        Status(LATER)
    later = Status.read(LATER)
    assert later == LATER and str(later) == LATER and f"{later}" == LATER
    assert later not in Status and later not in FINISHED
    assert not any(later in op.sources for op in Operation)
    assert Status.read(LATER) == later and json.dumps(later) == f'"{LATER}"'
    assert all(Status.read(s.value) is s for s in Status)
