"""Time-ordered job ids (UUID version 7), so new rows land at the end of the index."""

from __future__ import annotations

import os
import time
import uuid


def new_id() -> uuid.UUID:
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | (0x7 << 76) | ((rand >> 62) & 0xFFF) << 64
    value |= (0b10 << 62) | (rand & 0x3FFF_FFFF_FFFF_FFFF)
    return uuid.UUID(int=value)


def parse_id(text: str) -> uuid.UUID | None:
    """The job id in `text`, or None when it is not a UUID."""
    try:
        return uuid.UUID(text)
    except ValueError:
        return None
