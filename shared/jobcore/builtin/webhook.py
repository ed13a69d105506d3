"""The `webhook` handler (placeholder registration; implemented with the worker)."""

from __future__ import annotations

from typing import Any

from jobcore.errors import PermanentError
from jobcore.registry import JobContext, handler


@handler("webhook")
async def webhook(payload: Any, ctx: JobContext) -> None:
    raise PermanentError("webhook handler not available yet")
