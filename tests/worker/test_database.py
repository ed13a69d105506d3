"""PgJobStore on the real PostgreSQL, through a fault proxy: outages are logged once per
change of state, and a connection that goes silent times out instead of hanging."""

from __future__ import annotations

import logging

import pytest

from jobcore.db import make_engine
from jobqueue_worker import database
from jobqueue_worker.database import Availability, PgJobStore
from tests.faultproxy import FaultProxy
from tests.worker.support import submit


def _messages(caplog: pytest.LogCaptureFixture, msg: str) -> int:
    return sum(1 for r in caplog.records if r.getMessage() == msg)


async def test_database_outage_is_logged_once_per_change_of_state(database_url, engine, caplog):
    (job,) = await submit(engine, "sleep", {"duration": "0s"})
    with FaultProxy.to_database(database_url) as proxy:
        proxied = make_engine(proxy.database_url(database_url), pool_size=2, connect_timeout=2)
        store = PgJobStore(proxied)
        try:
            with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
                assert await store.recover_expired() == []
                proxy.refuse()
                proxy.cut()
                for _ in range(3):
                    with pytest.raises(Exception):  # noqa: B017 - any driver error will do
                        await store.claim(1, 60)
                assert _messages(caplog, "database unavailable") == 1
                proxy.pass_through()
                claimed = await store.claim(1, 60)
                await store.claim(1, 60)
            assert _messages(caplog, "database unavailable") == 1
            assert _messages(caplog, "database available again") == 1
        finally:
            await store.close()
            await proxied.dispose()
    assert [c.id for c in claimed] == [job]


async def test_a_silent_connection_times_out_and_the_store_recovers(
    database_url, engine, monkeypatch
):
    monkeypatch.setattr(database, "CLAIM_TIMEOUT", 1.0)
    (job,) = await submit(engine, "sleep", {"duration": "0s"})
    with FaultProxy.to_database(database_url) as proxy:
        proxied = make_engine(proxy.database_url(database_url), pool_size=2, connect_timeout=1)
        store = PgJobStore(proxied)
        try:
            await store.recover_expired()  # a pooled connection, open before the fault
            proxy.blackhole()
            with pytest.raises(TimeoutError):
                await store.claim(1, 60)
            proxy.pass_through()
            claimed = await store.claim(1, 60)
        finally:
            await store.close()
            await proxied.dispose()
    assert [c.id for c in claimed] == [job]


def test_a_call_begun_before_the_last_success_does_not_report_an_outage(caplog):
    availability = Availability(clock=lambda: 0.0)
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        availability.failed("claim", ConnectionError("refused"), started=1.0)
        availability.succeeded(started=3.0)
        # This call hung on a connection broken during the outage; it says nothing new.
        availability.failed("complete", TimeoutError(), started=2.0)
        assert availability.up
        availability.failed("claim", ConnectionError("refused"), started=4.0)
    assert [r.getMessage() for r in caplog.records] == [
        "database unavailable",
        "database available again",
        "database unavailable",
    ]
