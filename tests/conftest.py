"""Fixtures shared by every test: a fresh, migrated database per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore.db import make_engine
from jobcore.registry import load_handlers
from tests import pg

load_handlers([])


@pytest.fixture(scope="session")
def pg_server() -> str:
    """The maintenance URL of the PostgreSQL server the tests use."""
    return pg.server_url()


@pytest.fixture(scope="session")
def pg_template(pg_server: str) -> str:
    return pg.ensure_template(pg_server)


@pytest.fixture
def database_url(pg_server: str, pg_template: str) -> Iterator[str]:
    """URL of a database of this test's own, migrated to head."""
    name = pg.create_database(pg_server, pg_template)
    try:
        yield pg.with_database(pg_server, name)
    finally:
        pg.drop_database(pg_server, name)


@pytest.fixture
def empty_database_url(pg_server: str) -> Iterator[str]:
    """URL of an empty database of this test's own (no schema)."""
    name = pg.create_database(pg_server, None)
    try:
        yield pg.with_database(pg_server, name)
    finally:
        pg.drop_database(pg_server, name)


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(database_url, pool_size=10)
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
def start_api(database_url: str) -> Iterator[Any]:
    """Start real `jobqueue-api` processes (`start_api(**env)`, ready when it returns);
    any still running at the end of the test is killed."""
    from tests.e2e.test_api_process import Api

    started: list[Api] = []

    def start(**env: str) -> Api:
        api = Api(database_url, **env)
        started.append(api)
        api.wait_ready()
        return api

    yield start
    for api in started:
        if api.service.proc.poll() is None:
            api.service.kill()
