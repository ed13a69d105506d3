"""A handler module whose handler cannot be called as fn(payload, ctx): importing it fails."""

from __future__ import annotations

from typing import Any

from jobcore import handler


@handler("test.bad.signature")
async def takes_only_the_payload(payload: Any) -> None:
    return None
