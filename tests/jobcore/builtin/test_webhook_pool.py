"""The webhook connection pool: built once per process off the event loop, reused, and
connecting only to checked addresses."""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import ssl
import subprocess
import sys
import threading
import time

import httpcore
import pytest

from jobcore.builtin import webhook as webhook_module
from jobcore.builtin import webhook_pool
from jobcore.builtin.webhook import shared_pool, webhook
from jobcore.ids import new_id
from jobcore.registry import JobContext


def context(allow_private: bool = True) -> JobContext:
    return JobContext(new_id(), "webhook", 1, 5, webhook_allow_private=allow_private)


def fake_dns(monkeypatch, answer: list[str]) -> None:
    async def resolve(host, port):
        return [ipaddress.ip_address(a) for a in answer]

    monkeypatch.setattr(webhook_module, "resolve", resolve)


@pytest.fixture
def pools_made(monkeypatch) -> list[httpcore.AsyncConnectionPool]:
    made: list[httpcore.AsyncConnectionPool] = []
    real_new_pool = webhook_pool.new_pool

    def spy() -> httpcore.AsyncConnectionPool:
        made.append(real_new_pool())
        return made[-1]

    monkeypatch.setattr(webhook_pool, "new_pool", spy)
    return made


async def test_deliveries_share_one_pool_and_reuse_its_connection(recorder, pools_made):
    for n in range(5):
        await webhook({"url": recorder.url(), "body": {"n": n}}, context())
    assert [r.json() for r in recorder.requests] == [{"n": n} for n in range(5)]
    assert len(pools_made) == 1
    assert len({r.client_port for r in recorder.requests}) == 1  # one TCP connection


async def test_concurrent_first_deliveries_build_one_pool(recorder, pools_made, monkeypatch):
    monkeypatch.setattr(webhook_module, "_module", None)
    await asyncio.gather(*(webhook({"url": recorder.url()}, context()) for _ in range(8)))
    assert len(recorder.requests) == 8
    assert len(pools_made) == 1


async def test_a_connection_is_reused_only_for_the_same_host_name(monkeypatch, recorder):
    # Two names on one address: a TLS connection is checked for one name, so it must never
    # carry a request for the other.
    fake_dns(monkeypatch, ["127.0.0.1"])
    for host in ("a.example", "b.example", "a.example", "b.example"):
        await webhook({"url": recorder.url(host=host)}, context())
    ports = {}
    for received in recorder.requests:
        ports.setdefault(received.headers["host"], set()).add(received.client_port)
    a, b = (ports[f"{h}:{recorder.port}"] for h in ("a.example", "b.example"))
    assert len(a) == 1 and len(b) == 1 and a != b


async def test_each_address_policy_has_a_pool_of_its_own():
    assert await shared_pool(True) is await shared_pool(True)
    assert await shared_pool(True) is not await shared_pool(False)


async def test_pool_never_connects_without_a_checked_address(recorder):
    # Nothing resolved and checked for this request: the backend refuses rather than resolve.
    pool = await shared_pool(True)
    with pytest.raises(httpcore.ConnectError, match="no checked address"):
        await pool.request("GET", recorder.url(host="localhost"))
    assert recorder.requests == []


async def test_checked_address_of_one_host_is_not_used_for_another(recorder):
    to = webhook_pool.Destination("a.example", recorder.port, ("127.0.0.1",))
    token = webhook_pool.destination.set(to)
    try:
        pool = await shared_pool(True)
        with pytest.raises(httpcore.ConnectError, match="no checked address"):
            await pool.request("GET", recorder.url(host="b.example"))
    finally:
        webhook_pool.destination.reset(token)
    assert recorder.requests == []


async def test_first_pool_is_built_off_the_event_loop_which_keeps_running(monkeypatch, recorder):
    # Start as a fresh worker process does: no TLS context, nothing loaded.
    monkeypatch.setattr(webhook_module, "_module", None)
    monkeypatch.setattr(webhook_pool, "_tls", None)
    await webhook_module.close_pools()
    built_in: list[int] = []
    real_context = ssl.create_default_context

    def slow_context(*args, **kwargs):
        built_in.append(threading.get_ident())
        time.sleep(0.5)  # stands in for loading the CA bundle (tens of ms of CPU)
        return real_context(*args, **kwargs)

    monkeypatch.setattr(webhook_pool.ssl, "create_default_context", slow_context)
    loop = asyncio.get_running_loop()
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(loop.time())
            await asyncio.sleep(0.01)

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    try:
        started = loop.time()
        await webhook({"url": recorder.url()}, context())
        elapsed = loop.time() - started
    finally:
        ticking.cancel()
    assert len(recorder.requests) == 1
    assert len(built_in) == 1 and built_in[0] != threading.get_ident()
    assert elapsed >= 0.5
    longest_stall = max(b - a for a, b in itertools.pairwise(ticks))
    assert longest_stall < 0.25, f"the event loop stalled {longest_stall:.3f}s"


async def test_https_deliveries_verify_the_name_once_and_reuse_the_tls_connection(
    monkeypatch, tls_recorder, tmp_path
):
    # Trust the recorder's self-signed certificate for `hooks.example`, nothing else.
    monkeypatch.setattr(
        webhook_pool, "_tls", ssl.create_default_context(cafile=tmp_path / "cert.pem")
    )
    fake_dns(monkeypatch, ["127.0.0.1"])
    url = tls_recorder.url(host="hooks.example", scheme="https")
    for n in range(3):
        await webhook({"url": url, "body": {"n": n}}, context())
    assert [r.json() for r in tls_recorder.requests] == [{"n": n} for n in range(3)]
    assert tls_recorder.server_names == ["hooks.example"]  # one handshake, for the name
    assert len({r.client_port for r in tls_recorder.requests}) == 1
    assert {r.headers["host"] for r in tls_recorder.requests} == {
        f"hooks.example:{tls_recorder.port}"
    }


async def test_a_pooled_connection_the_server_closed_is_not_reused(recorder):
    await webhook({"url": recorder.url("/then-close")}, context())
    deadline = time.monotonic() + 5
    while not recorder.closed:
        assert time.monotonic() < deadline, "the recorder never closed the connection"
        await asyncio.sleep(0.01)
    # Sent on the closed connection, this would fail ("server disconnected"): a retry.
    await webhook({"url": recorder.url()}, context())
    first, second = recorder.requests
    assert first.client_port != second.client_port


def test_importing_the_handler_loads_no_http_stack():
    # The API imports every built-in handler and never sends a webhook.
    code = (
        "import sys, jobcore.builtin.webhook; "
        "print(sorted(m for m in ('httpx', 'httpcore', 'certifi', 'anyio') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
