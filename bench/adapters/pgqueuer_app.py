"""The PgQueuer factory its workers load (`pgq run ...:create_pgqueuer`): one no-op entrypoint."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pgqueuer import Job, PgQueuer

from bench.beacon import report_payload


@asynccontextmanager
async def create_pgqueuer() -> AsyncIterator[PgQueuer]:
    conn = await asyncpg.connect(os.environ["BENCH_PGQUEUER_DSN"])
    try:
        pgq = PgQueuer.from_asyncpg_connection(conn)

        @pgq.entrypoint("noop")
        async def noop(job: Job) -> None:
            if job.payload:
                report_payload(json.loads(job.payload))

        yield pgq
    finally:
        await conn.close()
