"""The no-op handler our worker and API load (JOB_HANDLERS) during a benchmark."""

from __future__ import annotations

from typing import Any

from bench.beacon import report_payload
from jobcore import JobContext, handler

JOB_TYPE = "bench-noop"


@handler(JOB_TYPE)
async def bench_noop(payload: Any, ctx: JobContext) -> None:
    report_payload(payload)
