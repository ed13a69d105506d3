"""The handlers our worker and API load (JOB_HANDLERS) during a benchmark."""

from __future__ import annotations

import asyncio
from typing import Any

from bench.beacon import report_payload
from jobcore import JobContext, handler

JOB_TYPE = "bench-noop"
# Jobs that stay running for a while, so a heartbeat always finds leases to renew (and
# whose start a payload with a marker reports, as the no-op's does).
SLEEP_TYPE = "bench-sleep"
SLEEP_SECONDS = 0.05
# A no-op type of its own, for drains where one type gets a limit (TYPE_CONCURRENCY).
LIMITED_TYPE = "bench-limited"


@handler(JOB_TYPE)
async def bench_noop(payload: Any, ctx: JobContext) -> None:
    report_payload(payload)


@handler(SLEEP_TYPE)
async def bench_sleep(payload: Any, ctx: JobContext) -> None:
    report_payload(payload)
    await asyncio.sleep(SLEEP_SECONDS)


@handler(LIMITED_TYPE)
async def bench_limited(payload: Any, ctx: JobContext) -> None:
    pass
