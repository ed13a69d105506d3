"""A handler type that is new in a release: the new release's workers import this module
(`JOB_HANDLERS`), the previous release's workers do not; the API names it in `JOB_TYPES`
(tests/e2e/test_worker_unhandled.py)."""

from __future__ import annotations

from typing import Any

from jobcore import JobContext, handler

NEW_TYPE = "test.rollout.new"


@handler(NEW_TYPE)
async def new_in_this_release(payload: Any, ctx: JobContext) -> dict[str, int]:
    return {"attempt": ctx.attempt}
