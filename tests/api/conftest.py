"""Fixtures for in-process API tests: the real app on the real database, through httpx."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette

from jobcore import logs
from jobcore.settings import load_api_settings
from jobqueue_api.app import close, create_app
from jobqueue_api.database import open_engine

MakeApi = Callable[..., Awaitable[httpx.AsyncClient]]


@pytest.fixture
async def make_api(database_url: str) -> AsyncIterator[MakeApi]:
    """`await make_api(API_TOKENS="t", ...)`: a client of a fresh app configured by those
    variables (DATABASE_URL defaults to this test's database). `client.app` is the app."""
    engines: list[AsyncEngine] = []
    clients: list[httpx.AsyncClient] = []

    async def make(**env: str) -> httpx.AsyncClient:
        settings = load_api_settings({"DATABASE_URL": database_url, **env})
        engine = open_engine(settings.database_url)
        engines.append(engine)
        app = create_app(settings, engine)
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://api", timeout=30
        )
        client.app = app  # type: ignore[attr-defined]
        clients.append(client)
        return client

    yield make
    for client in clients:
        await close(app_of(client))
        await client.aclose()
    for engine in engines:
        await engine.dispose()


@pytest.fixture
async def api(make_api: MakeApi) -> httpx.AsyncClient:
    return await make_api()


def app_of(client: httpx.AsyncClient) -> Starlette:
    app: Starlette = client.app  # type: ignore[attr-defined]
    return app


async def job_count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(sa.text("SELECT count(*) FROM jobqueue.jobs")) or 0)


class LogCapture:
    """The JSON log lines written while a test runs, formatted exactly as the services do."""

    def __init__(self) -> None:
        self.stream = io.StringIO()

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stream.getvalue().splitlines() if line]


@pytest.fixture
def captured_logs() -> Iterator[LogCapture]:
    capture = LogCapture()
    handler = logging.StreamHandler(capture.stream)
    handler.setFormatter(logs.JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield capture
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
