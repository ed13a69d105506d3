"""LISTEN/NOTIFY wake-ups: a notified job is picked up long before the next poll, and a
listening connection that went half-open is detected and re-established."""

from __future__ import annotations

import time

import httpx
import pytest

from jobcore import store
from jobcore.ids import new_id
from jobcore.rows import NewJob
from tests.faultproxy import FaultProxy
from tests.worker.support import all_in, eventually, start_worker, until

pytestmark = pytest.mark.e2e

# Far longer than any wait below: a job picked up within the test's deadlines was woken.
POLL = "120s"


async def _submit_and_notify(engine) -> list:
    async with engine.begin() as conn:
        job, _ = await store.submit(conn, NewJob(new_id(), "test.record", {}, 3))
        await store.notify(conn)
    return [job.id]


def _listening(worker) -> int:
    return len(worker.messages("listening for wake-ups"))


async def test_a_notification_wakes_an_idle_worker_before_its_poll(database_url, engine, tmp_path):
    worker = start_worker(database_url, tmp_path, POLL_INTERVAL=POLL)
    try:
        await until(lambda: _listening(worker) == 1, 90, "the listener")
        await until(lambda: worker.messages("worker process started"), 30, "the process")
        started = time.monotonic()
        ids = await _submit_and_notify(engine)
        await eventually(lambda: all_in(engine, ids, "completed"), 10, "the notified job")
        assert time.monotonic() - started < 10
    finally:
        assert worker.stop(60) == 0


async def test_a_half_open_listening_connection_is_detected_and_reestablished(
    database_url, engine, tmp_path
):
    with FaultProxy.to_database(database_url) as proxy:
        worker = start_worker(proxy.database_url(database_url), tmp_path, POLL_INTERVAL=POLL)
        try:
            await until(lambda: _listening(worker) == 1, 90, "the listener")
            # Half-open: the connection stays up, but nothing crosses it any more.
            proxy.blackhole()
            await until(
                lambda: worker.messages("wake-up listener lost"),
                30,
                "the silent connection noticed",
            )
            proxy.cut()
            proxy.pass_through()
            await until(lambda: _listening(worker) == 2, 30, "listening again")
            ids = await _submit_and_notify(engine)
            await eventually(lambda: all_in(engine, ids, "completed"), 20, "the notified job")
        finally:
            assert worker.stop(60) == 0


async def test_a_worker_with_its_own_database_listen_url_listens_there_and_wakes_on_a_notify(
    database_url, engine, tmp_path
):
    # The same database through a proxy: only what connects with DATABASE_LISTEN_URL
    # comes through it.
    with FaultProxy.to_database(database_url) as proxy:
        worker = start_worker(
            database_url,
            tmp_path,
            POLL_INTERVAL=POLL,
            DATABASE_LISTEN_URL=proxy.database_url(database_url),
        )
        try:
            await until(lambda: _listening(worker) == 1, 90, "the listener")
            await until(lambda: worker.messages("worker process started"), 30, "the process")
            assert proxy.open_connections == 1  # the listener's, and nothing else
            started = time.monotonic()
            ids = await _submit_and_notify(engine)
            await eventually(lambda: all_in(engine, ids, "completed"), 10, "the notified job")
            assert time.monotonic() - started < 10
            assert proxy.open_connections == 1
        finally:
            assert worker.stop(60) == 0


def _readyz(worker) -> dict:
    """/readyz's body; empty while nothing answers yet."""
    try:
        return worker.get("/readyz").json()
    except httpx.HTTPError:
        return {}


def _unheard_checks(worker) -> float:
    for line in worker.get("/metrics").text.splitlines():
        if line.startswith("jobs_notifications_unheard_total "):
            return float(line.split()[1])
    return 0.0


async def test_a_listener_that_hears_its_notification_check_is_shown_ok(
    database_url, engine, tmp_path
):
    worker = start_worker(database_url, tmp_path)
    try:
        await until(lambda: _readyz(worker).get("notifications") == "ok", 60, "a check heard")
        assert _unheard_checks(worker) == 0
        assert worker.messages("notifications unheard") == []
    finally:
        assert worker.stop(60) == 0


async def test_a_listener_that_hears_nothing_is_logged_counted_and_shown_and_polling_goes_on(
    database_url, empty_database_url, engine, tmp_path
):
    # LISTEN on another database: the connection answers and says it listens, but no
    # notification of the jobs' database ever reaches it (as behind a pooler in
    # transaction mode).
    worker = start_worker(
        database_url, tmp_path, DATABASE_LISTEN_URL=empty_database_url, POLL_INTERVAL="0.5s"
    )
    try:
        await until(lambda: _listening(worker) == 1, 90, "the listener")
        await until(
            lambda: _readyz(worker).get("notifications") == "unheard", 30, "the check's verdict"
        )
        assert worker.status_of("/readyz") == 200  # the worker still takes jobs: by polling
        assert _unheard_checks(worker) >= 1
        (warning,) = worker.messages("notifications unheard")
        assert warning["level"] == "warning" and "DATABASE_LISTEN_URL" in warning["hint"]
        ids = await _submit_and_notify(engine)
        await eventually(lambda: all_in(engine, ids, "completed"), 10, "a job, by polling")
    finally:
        assert worker.stop(60) == 0
