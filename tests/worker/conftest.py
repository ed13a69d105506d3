"""Fixtures of the worker tests."""

import pytest

from jobqueue_worker.database import PgJobStore


@pytest.fixture
async def pg(engine):
    """The worker's store on the test's database."""
    pg = PgJobStore(engine)
    try:
        yield pg
    finally:
        await pg.close()
