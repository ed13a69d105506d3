"""The `sleep` handler: waits for a Go-style duration, honouring cancellation."""

from __future__ import annotations

import asyncio
from typing import Any

from jobcore.durations import parse_duration
from jobcore.errors import PermanentError
from jobcore.registry import JobContext, handler


@handler("sleep")
async def sleep(payload: Any, ctx: JobContext) -> None:
    if not isinstance(payload, dict) or "duration" not in payload:
        raise PermanentError('payload must be an object like {"duration": "2s"}')
    try:
        seconds = parse_duration(payload["duration"])
    except ValueError as exc:
        raise PermanentError(f"invalid duration: {exc}") from None
    await asyncio.sleep(seconds)
