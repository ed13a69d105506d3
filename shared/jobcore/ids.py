"""Time-ordered job ids (UUID version 7), so new rows land at the end of the index."""

from __future__ import annotations

import os
import time
import uuid


def new_id() -> uuid.UUID:
    return new_ids(1)[0]


def new_ids(n: int) -> list[uuid.UUID]:
    """`n` ids: the current millisecond, then 74 random bits each. One clock read and one
    read of the random source for the lot, which is most of what an id costs."""
    ms = time.time_ns() // 1_000_000
    head = (ms & 0xFFFF_FFFF_FFFF) << 80 | (0x7 << 76) | (0b10 << 62)
    rand = os.urandom(10 * n)
    values = []
    for start in range(0, 10 * n, 10):
        bits = int.from_bytes(rand[start : start + 10], "big")
        values.append(head | ((bits >> 62) & 0xFFF) << 64 | (bits & _LOW_62))
    # In increasing order, so a batch's rows append at the right edge of every index that
    # ends in the id (PostgreSQL's btree then skips the descent from the root).
    values.sort()
    return [uuid.UUID(int=value) for value in values]


_LOW_62 = (1 << 62) - 1


def parse_id(text: str) -> uuid.UUID | None:
    """The job id in `text`, or None when it is not a UUID."""
    try:
        return uuid.UUID(text)
    except ValueError:
        return None
