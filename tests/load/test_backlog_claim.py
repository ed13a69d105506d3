"""Claim latency does not grow with the backlog: `claim` of 10 jobs with 200,000 pending
jobs stays within a small factor of the same claim with 1,000 pending.

A regression guard against a claim that scans or sorts the pending rows (a lost
partial index, an `OR` in the predicate), not a timing benchmark: the bound is
generous (3x the p99 at 1k pending plus 10 ms) so a busy machine does not trip it,
while a scan of 200k rows does.

Each sample is one claim statement in its own transaction, timed around the
statement; the claimed jobs are then released, so the pending count stays exactly
at the level measured (release spends no attempt).
"""

from __future__ import annotations

import os
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import compiled
from jobcore.states import Operation
from tests.load.report import FIGURES, latency_ms, percentile
from tests.pg import driver

N = 10
SAMPLES = int(os.environ.get("BACKLOG_SAMPLES") or 300)
WARMUP = 20
LEVELS = (1_000, 200_000)
FACTOR, SLACK_SECONDS = 3.0, 0.010

FILL = sa.text(
    """
    INSERT INTO jobqueue.jobs (id, type, payload, max_attempts, run_at)
    SELECT gen_random_uuid(), 'sleep', '{"duration": "0s"}', 5,
           now() - random() * interval '1 hour'
    FROM generate_series(1, :count)
    """
)


async def fill_to(engine: AsyncEngine, level: int) -> None:
    async with engine.begin() as conn:
        pending = await conn.scalar(
            sa.text("SELECT count(*) FROM jobqueue.jobs WHERE status = 'pending'")
        )
        await conn.execute(FILL, {"count": level - pending})
    # What autovacuum would have done on a table this size before anyone measured.
    async with engine.connect() as conn:
        autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await autocommit.execute(sa.text("VACUUM ANALYZE jobqueue.jobs"))


async def claim_latencies(engine: AsyncEngine, level: int) -> list[float]:
    seconds = []
    for sample in range(WARMUP + SAMPLES):
        async with engine.begin() as conn:
            raw = await driver(conn)
            started = time.perf_counter()
            claimed = await compiled.claim(raw, {"default": N}, lease_seconds=60)
            elapsed = time.perf_counter() - started
        assert len(claimed) == N
        async with engine.begin() as conn:
            raw = await driver(conn)
            assert (
                await compiled.record(raw, Operation.RELEASE, [job.lease for job in claimed]) == []
            )
        if sample >= WARMUP:
            seconds.append(elapsed)
    async with engine.connect() as conn:
        pending = await conn.scalar(
            sa.text("SELECT count(*) FROM jobqueue.jobs WHERE status = 'pending'")
        )
    assert pending == level
    return seconds


@pytest.mark.load
async def test_claim_latency_stays_flat_from_1k_to_200k_pending(engine: AsyncEngine) -> None:
    measured: dict[int, list[float]] = {}
    for level in LEVELS:
        await fill_to(engine, level)
        measured[level] = await claim_latencies(engine, level)

    FIGURES["backlog_claim"] = {
        "n": N,
        "samples": SAMPLES,
        "pending": {str(level): latency_ms(seconds) for level, seconds in measured.items()},
    }
    small, large = (percentile(measured[level], 99) for level in LEVELS)
    assert large <= FACTOR * small + SLACK_SECONDS, FIGURES["backlog_claim"]
