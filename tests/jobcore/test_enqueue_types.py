"""Transactional enqueue of a type this process has no handler for: accepted when a worker
recorded it in `job_types` (read on the caller's own connection), with the recorded options
as defaults; refused, writing nothing, when nobody did."""

from __future__ import annotations

import asyncpg
import pytest
import sqlalchemy as sa

from jobcore import enqueue
from jobcore.errors import InvalidRequest
from jobcore.schema import job_types, jobs


def _record(conn: sa.Connection, job_type: str, options: dict[str, object]) -> None:
    conn.execute(sa.insert(job_types).values(type=job_type, options=options, recorded_by="test:1"))


def _sync_engine(database_url: str) -> sa.Engine:
    return sa.create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))


def test_enqueue_accepts_a_recorded_type_with_its_options_on_the_callers_connection(
    database_url,
):
    engine = _sync_engine(database_url)
    try:
        with engine.begin() as conn:
            _record(conn, "test.enqueue.remote", {"queue": "mail", "priority": 4})
        with engine.begin() as conn:
            job_id = enqueue(conn, "test.enqueue.remote", {"n": 1}, priority=1)
            row = conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).mappings().one()
        assert (row["queue"], row["priority"]) == ("mail", 1)
        with engine.begin() as conn, pytest.raises(InvalidRequest, match="JOB_TYPES"):
            enqueue(conn, "test.enqueue.nobody")
    finally:
        engine.dispose()


async def test_enqueue_on_asyncpg_reads_the_record_too(database_url):
    engine = _sync_engine(database_url)
    try:
        with engine.begin() as conn:
            _record(conn, "test.enqueue.remote-async", {"max_attempts": 9})
    finally:
        engine.dispose()
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            job_id = await enqueue(conn, "test.enqueue.remote-async")
    finally:
        await conn.close()
    engine = _sync_engine(database_url)
    try:
        with engine.connect() as sync:
            found = sync.scalar(sa.select(jobs.c.max_attempts).where(jobs.c.id == job_id))
        assert found == 9
    finally:
        engine.dispose()
