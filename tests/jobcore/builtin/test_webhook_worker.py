"""The webhook handler run by the real `jobqueue-worker`: WEBHOOK_ALLOW_PRIVATE end to end."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
from typing import Literal, overload
from uuid import UUID

import pytest

from jobcore import store
from jobcore.builtin.webhook_policy import is_forbidden
from jobcore.db import make_engine
from jobcore.ids import new_id
from jobcore.rows import Job, NewJob
from tests.procs import Service, free_port, wait_for

pytestmark = [pytest.mark.e2e]


async def _submit(url: str, payload: object) -> UUID:
    engine = make_engine(url, pool_size=1)
    try:
        async with engine.begin() as conn:
            job, _ = await store.submit(conn, NewJob(new_id(), "webhook", payload, 3))
        return job.id
    finally:
        await engine.dispose()


async def _get(url: str, job_id: UUID) -> Job:
    engine = make_engine(url, pool_size=1)
    try:
        async with engine.begin() as conn:
            job = await store.get(conn, job_id)
        assert job is not None
        return job
    finally:
        await engine.dispose()


@overload
def run_webhook(database_url: str, hook_url: str, allow_private: str) -> Job: ...


@overload
def run_webhook(
    database_url: str, hook_url: str, allow_private: str, with_output: Literal[True]
) -> tuple[Job, str]: ...


def run_webhook(
    database_url: str, hook_url: str, allow_private: str, with_output: bool = False
) -> Job | tuple[Job, str]:
    """Submit one webhook job, run a worker until the job is finished, return the job."""
    job_id = asyncio.run(_submit(database_url, {"url": hook_url, "body": {"n": 1}}))
    worker = Service(
        "jobqueue-worker",
        {
            "DATABASE_URL": database_url,
            "METRICS_ADDR": f"127.0.0.1:{free_port()}",
            "POLL_INTERVAL": "100ms",
            "WEBHOOK_ALLOW_PRIVATE": allow_private,
        },
    )
    try:
        job = wait_for(
            lambda: (
                (j := asyncio.run(_get(database_url, job_id))).status
                in ("completed", "failed", "dead_letter")
                and j
            ),
            90,
            "the webhook job to finish",
            interval=0.2,
        )
        assert worker.stop(60) == 0, worker.output()
    finally:
        worker.kill()
    return (job, worker.output()) if with_output else job


def test_worker_refuses_loopback_webhook_unless_allowed_and_sends_nothing(database_url, recorder):
    job = run_webhook(database_url, recorder.url(), allow_private="false")
    assert job.status == "failed" and job.attempts == 1
    assert "refusing" in (job.last_error or "")
    assert recorder.requests == []


def test_worker_delivers_to_loopback_when_private_destinations_are_allowed(database_url, recorder):
    job = run_webhook(database_url, recorder.url(), allow_private="true")
    assert job.status == "completed", job.last_error
    (received,) = recorder.requests
    assert received.json() == {"n": 1}
    assert received.headers["idempotency-key"] == str(job.id)


def test_worker_keeps_resolved_addresses_out_of_last_error_and_logs_them(database_url, recorder):
    # This machine's own name resolves (through /etc/hosts or DNS) to one of its addresses.
    name = socket.gethostname()
    addresses = {info[4][0] for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)}
    if not all(is_forbidden(ipaddress.ip_address(a.partition("%")[0])) for a in addresses):
        pytest.skip(f"{name} resolves to a public address here")
    job, output = run_webhook(database_url, recorder.url(host=name), "false", with_output=True)
    assert job.status == "failed" and job.attempts == 1
    assert "not a public address" in (job.last_error or "") and name in (job.last_error or "")
    assert not any(address in (job.last_error or "") for address in addresses)
    (line,) = [json.loads(x) for x in output.splitlines() if "destination refused" in x]
    assert set(line["addresses"]) == addresses
    assert line["job_id"] == str(job.id) and line["host"] == name
    assert recorder.requests == []
