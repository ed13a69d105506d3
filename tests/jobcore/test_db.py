"""libpq URL parameters in DATABASE_URL, against the real server (which has no TLS).

Every connection is made through `jobcore.db.connect_args`: the engines (`make_engine`),
the worker's LISTEN connection and migrations. These tests connect both ways.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator

import asyncpg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from jobcore.db import check_url, connect, connect_args, make_engine, probe_writable
from jobcore.errors import ConfigError
from jobcore.settings import load_worker_settings
from jobqueue_worker.listener import Listener


def with_query(url: str, query: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{query}"


async def engine_value(url: str, sql: str, **kwargs: object) -> object:
    engine = make_engine(url, pool_size=1, **kwargs)  # type: ignore[arg-type]
    try:
        async with engine.connect() as conn:
            return await conn.scalar(sa.text(sql))
    finally:
        await engine.dispose()


async def direct_value(url: str, sql: str) -> object:
    conn = await asyncpg.connect(**connect_args(url))
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


@pytest.mark.parametrize("mode", ["disable", "allow", "prefer"])
async def test_sslmodes_that_allow_plain_connections_reach_a_server_without_tls(database_url, mode):
    url = with_query(database_url, f"sslmode={mode}")
    mine = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
    assert await engine_value(url, "SHOW ssl") == "off"
    assert await engine_value(url, mine) is False
    assert await direct_value(url, mine) is False


async def test_sslmode_require_fails_as_a_connection_error_against_a_server_without_tls(
    database_url,
):
    url = with_query(database_url, "sslmode=require")
    with pytest.raises(ConnectionError, match="SSL"):
        await direct_value(url, "SELECT 1")
    with pytest.raises(Exception) as caught:
        await engine_value(url, "SELECT 1")
    assert not isinstance(caught.value, TypeError)
    assert "SSL" in str(caught.value)


async def test_application_name_from_the_url_shows_in_pg_stat_activity(database_url):
    url = with_query(database_url, "application_name=from-the-url")
    sql = "SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()"
    assert await engine_value(url, sql, application_name="jobqueue-api") == "from-the-url"
    assert await direct_value(url, sql) == "from-the-url"
    # Without it, each service names its own connections.
    assert await engine_value(database_url, sql, application_name="jobqueue-api") == "jobqueue-api"


async def test_options_from_the_url_set_session_parameters(database_url):
    url = with_query(database_url, "options=-c%20statement_timeout%3D1234%20-c%20work_mem%3D5MB")
    assert await engine_value(url, "SHOW statement_timeout") == "1234ms"
    assert await direct_value(url, "SHOW work_mem") == "5MB"


async def test_a_connection_sends_no_startup_parameter_but_its_name_and_the_urls_options():
    # A pooler refuses any other ("unsupported startup parameter"); the services' own
    # settings are their transactions' (SET LOCAL), never the session's.
    assert connect_args("postgresql://h/db", application_name="jobqueue-api")[
        "server_settings"
    ] == {"application_name": "jobqueue-api"}
    assert set(connect_args("postgresql://h/db?options=-c%20x%3D1")["server_settings"]) == {
        "application_name",
        "options",
    }


async def test_host_and_port_as_query_parameters_and_a_host_list(database_url):
    parts = make_url(database_url)
    user, name = f"{parts.username}@" if parts.username else "", parts.database
    query_form = f"postgresql://{user}/{name}?host=127.0.0.1&port=5432"
    assert await engine_value(query_form, "SELECT current_database()") == name
    # libpq tries the hosts in order: nothing listens on port 1.
    listed = f"postgresql://{user}@127.0.0.1:1,127.0.0.1:5432/{name}"
    assert await engine_value(listed, "SELECT current_database()") == name


async def test_target_session_attrs_is_honoured(database_url):
    primary = with_query(database_url, "target_session_attrs=read-write")
    assert await engine_value(primary, "SELECT pg_is_in_recovery()") is False
    standby = with_query(database_url, "target_session_attrs=standby")
    with pytest.raises(Exception, match=r"standby|session"):
        await direct_value(standby, "SELECT 1")


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts TCP connections and never says a word."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


async def test_connect_timeout_from_the_url_bounds_the_connect(silent_server):
    url = f"postgresql://u@127.0.0.1:{silent_server}/db?connect_timeout=2"
    started = time.monotonic()
    with pytest.raises((TimeoutError, asyncio.TimeoutError)):
        await asyncpg.connect(**connect_args(url, timeout=30))
    assert 1.5 < time.monotonic() - started < 10
    # connect_timeout=0 is "no limit" in libpq; a service keeps its own bound instead.
    assert connect_args(url.replace("=2", "=0"), timeout=7)["timeout"] == 7
    assert connect_args(url.replace("=2", "=1"))["timeout"] == 2  # libpq's minimum


async def test_a_silent_first_host_leaves_the_next_host_a_connect_timeout_of_its_own(
    database_url, silent_server, caplog
):
    # A failed primary whose machine drops every packet, listed before the live server.
    parts = make_url(database_url)
    user, name = f"{parts.username}@" if parts.username else "", parts.database
    live = f"{parts.host or '127.0.0.1'}:{parts.port or 5432}"
    listed = f"postgresql://{user}127.0.0.1:{silent_server},{live}/{name}?connect_timeout=2"
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="jobqueue"):
        assert await engine_value(listed, "SELECT inet_server_port()") == (parts.port or 5432)
    assert 1.5 < time.monotonic() - started < 10
    # The log says which host was skipped, why, and which one was tried next.
    (skipped,) = [r for r in caplog.records if r.getMessage() == "database host skipped"]
    assert skipped.host == f"127.0.0.1:{silent_server}" and skipped.next_host == live
    assert "TimeoutError" in skipped.error
    # The LISTEN connections connect the same way.
    conn = await connect(**connect_args(listed, timeout=30))
    try:
        assert await conn.fetchval("SELECT current_database()") == name
    finally:
        await conn.close()


async def test_a_readiness_probe_that_gives_up_leaves_its_connect_to_reach_the_next_host(
    database_url, silent_server
):
    parts = make_url(database_url)
    user, name = f"{parts.username}@" if parts.username else "", parts.database
    live = f"{parts.host or '127.0.0.1'}:{parts.port or 5432}"
    listed = f"postgresql://{user}127.0.0.1:{silent_server},{live}/{name}?connect_timeout=2"
    engine = make_engine(listed, pool_size=1, isolation_level="AUTOCOMMIT")
    try:
        # Each probe waits less than the silent host's connect timeout...
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await probe_writable(engine)
        # ...and yet the connect it started reaches the live host, for a later probe.
        deadline = time.monotonic() + 10
        while True:
            try:
                async with asyncio.timeout(0.5):
                    await probe_writable(engine)
                break
            except TimeoutError:
                assert time.monotonic() < deadline, "no probe ever succeeded"
        async with asyncio.timeout(0.5):  # at once: the connection is pooled
            await probe_writable(engine)
    finally:
        await engine.dispose()


async def test_the_listener_connects_through_the_same_translation(database_url, engine):
    url = with_query(database_url, "sslmode=disable&application_name=listener-from-url")
    stopped = asyncio.Event()
    woken = asyncio.Event()
    task = asyncio.create_task(Listener(url, woken.set).run(stopped))
    try:
        async with asyncio.timeout(20):
            await woken.wait()  # woken once connected
        async with engine.connect() as conn:
            names = (
                await conn.scalars(sa.text("SELECT application_name FROM pg_stat_activity"))
            ).all()
        assert "listener-from-url" in names
    finally:
        stopped.set()
        await asyncio.wait_for(task, 10)


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("foo=bar", "'foo'"),
        ("sslcompression=1", "'sslcompression'"),
        ("keepalives=1", "'keepalives'"),
        ("sslmode=required", "sslmode"),
        ("sslmode=", "'sslmode'"),
        ("connect_timeout=soon", "connect_timeout"),
        ("connect_timeout=99999", "connect_timeout"),
        ("target_session_attrs=master", "target_session_attrs"),
        ("sslrootcert=/no/such/ca.pem", "sslrootcert"),
        ("sslrootcert=system", "sslrootcert"),
        ("sslmode=require&sslcert=/no/such/cert.pem", "sslcert"),
        ("sslmode", "sslmode"),
    ],
)
def test_unsupported_parameters_and_values_are_refused_naming_them(query, named):
    url = f"postgresql://u:s3cret@db.example/jobs?{query}"
    with pytest.raises(ValueError, match=named):
        check_url(url)
    with pytest.raises(ConfigError) as caught:
        load_worker_settings({"DATABASE_URL": url})
    assert caught.value.variable == "DATABASE_URL"
    assert named in caught.value.message and "s3cret" not in str(caught.value)
    assert "\n" not in str(caught.value)


def test_translation_keeps_what_asyncpg_parses_and_moves_the_rest():
    url = (
        "postgres://u:p%40ss@db.example:6543/jobs?sslmode=verify-full&connect_timeout=10"
        "&application_name=app&options=-c%20search_path%3Dx&target_session_attrs=primary"
    )
    args = connect_args(url, application_name="jobqueue-worker", timeout=5)
    assert args == {
        "dsn": "postgresql://u:p%40ss@db.example:6543/jobs"
        "?sslmode=verify-full&target_session_attrs=primary",
        "timeout": 10.0,
        "server_settings": {"application_name": "app", "options": "-c search_path=x"},
    }
