"""The settings' small languages (docs/configuration.md), parsed into the values services use.

Each parser takes the variable's text and returns its typed value, or raises `ValueError`
with the message the service prints after the variable's name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from jobcore.schema import QUEUE_PATTERN


class Address(NamedTuple):
    """A listen address (`HTTP_ADDR`, `METRICS_ADDR`): `host:port`, `:port` (all interfaces,
    host "0.0.0.0") or `[v6]:port`. `str()` gives `host:port` back, the IPv6 host in brackets."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_addr(value: str) -> Address:
    """`host:port`, `:port` or `[v6]:port`; an empty host means all interfaces."""
    match = re.fullmatch(r"(?:\[([^\]]+)\]|([^:\[\]]*)):(\d{1,5})", value.strip())
    if match is None or not 0 <= int(match.group(3)) <= 65535:
        raise ValueError(f"{value!r} is not a listen address like :8080 or 127.0.0.1:8080")
    return Address(match.group(1) or match.group(2) or "0.0.0.0", int(match.group(3)))


def parse_list(value: str) -> list[str]:
    """`JOB_HANDLERS`, `API_TOKENS`: comma-separated items; blanks around commas are ignored."""
    return [item.strip() for item in value.split(",") if item.strip()]


# The slots of one queue of QUEUES, per worker process.
MAX_QUEUE_SLOTS = 10_000


def parse_queues(value: str, *, workers: int) -> dict[str, int]:
    """`QUEUES`: comma-separated `name` or `name:slots`; a name alone gets `workers` slots.
    Returns queue -> slots."""
    queues: dict[str, int] = {}
    for item in value.split(","):
        name, _, slots = item.strip().partition(":")
        if not re.fullmatch(QUEUE_PATTERN, name):
            raise ValueError(f"queue name {name!r} must match {QUEUE_PATTERN}")
        if name in queues:
            raise ValueError(f"queue {name!r} is listed twice")
        if not slots:
            queues[name] = workers
        elif slots.isdigit() and 1 <= int(slots) <= MAX_QUEUE_SLOTS:
            queues[name] = int(slots)
        else:
            raise ValueError(
                f"slots of queue {name!r} must be an integer from 1 to {MAX_QUEUE_SLOTS}"
            )
    return queues


# The largest MAX_PENDING cap: far above any table a queue should hold, well inside bigint.
MAX_PENDING_CAP = 1_000_000_000


class PendingCaps(NamedTuple):
    """`MAX_PENDING`: the cap of each queue listed, and `others`, the cap of every queue not
    listed (None: those have no cap). `PendingCaps({}, None)`: no admission control."""

    by_queue: dict[str, int]
    others: int | None


def parse_max_pending(value: str) -> PendingCaps:
    """`MAX_PENDING`: `N` (every queue), `name:N,...` (those queues), or both (`N` for the
    queues not listed); empty: no cap."""
    caps: dict[str, int] = {}
    others: int | None = None
    if not value.strip():
        return PendingCaps(caps, others)
    for item in value.split(","):
        name, colon, number = item.strip().rpartition(":")
        if not colon:
            if others is not None:
                raise ValueError("a bare number (the cap of every other queue) is given twice")
        elif not re.fullmatch(QUEUE_PATTERN, name):
            raise ValueError(f"queue name {name!r} must match {QUEUE_PATTERN}")
        elif name in caps:
            raise ValueError(f"queue {name!r} is listed twice")
        digits = number.isascii() and number.isdigit() and len(number) <= 10
        if not (digits and 1 <= int(number) <= MAX_PENDING_CAP):
            where = f"of queue {name!r} " if colon else ""
            raise ValueError(f"the cap {where}must be an integer from 1 to {MAX_PENDING_CAP}")
        if colon:
            caps[name] = int(number)
        else:
            others = int(number)
    return PendingCaps(caps, others)


# TYPE_CONCURRENCY / TYPE_RATE: a job type as registered (any name without commas or
# whitespace); the limit after its last colon.
_TYPE_LIMIT_MAX = 1_000_000
_RATE_PERIODS = {"s": 1.0, "m": 60.0}


def _type_items(value: str) -> list[tuple[str, str]]:
    items: list[tuple[str, str]] = []
    if not value.strip():
        return items
    seen: set[str] = set()
    for item in value.split(","):
        name, colon, limit = item.strip().rpartition(":")
        if not colon or not name or any(ch.isspace() for ch in name):
            raise ValueError(f"{item.strip()!r} is not type:limit")
        if name in seen:
            raise ValueError(f"type {name!r} is listed twice")
        seen.add(name)
        items.append((name, limit))
    return items


def _count(limit: str, name: str, what: str) -> int:
    digits = limit.isascii() and limit.isdigit() and len(limit) <= 7
    if not (digits and 1 <= int(limit) <= _TYPE_LIMIT_MAX):
        raise ValueError(f"{what} of type {name!r} must be an integer from 1 to {_TYPE_LIMIT_MAX}")
    return int(limit)


def parse_type_concurrency(value: str) -> dict[str, int]:
    """`TYPE_CONCURRENCY`: `type:n,...`, at most n jobs of the type processing at once.
    Returns type -> n."""
    return {name: _count(limit, name, "the limit") for name, limit in _type_items(value)}


def parse_type_rate(value: str) -> dict[str, tuple[int, float]]:
    """`TYPE_RATE`: `type:n/s` or `type:n/m,...`, at most n attempts of the type started per
    second (per minute). Returns type -> (n, the window in seconds)."""
    rates: dict[str, tuple[int, float]] = {}
    for name, limit in _type_items(value):
        count, slash, unit = limit.partition("/")
        if not slash or unit not in _RATE_PERIODS:
            raise ValueError(f"the rate of type {name!r} must be n/s or n/m, got {limit!r}")
        rates[name] = (_count(count, name, "the rate"), _RATE_PERIODS[unit])
    return rates


def parse_key_concurrency(value: str) -> dict[str, int]:
    """`KEY_CONCURRENCY`: `queue:n,...`, and `*:n` for every queue without an entry of its
    own: at most n jobs of the queue with one concurrency key processing at once. Returns
    queue (or "*") -> n."""
    limits: dict[str, int] = {}
    if not value.strip():
        return limits
    for item in value.split(","):
        name, colon, number = item.strip().rpartition(":")
        if not colon or not name:
            raise ValueError(f"{item.strip()!r} is not queue:limit")
        if name != "*" and not re.fullmatch(QUEUE_PATTERN, name):
            raise ValueError(f"queue name {name!r} must match {QUEUE_PATTERN} (or be *)")
        if name in limits:
            raise ValueError(f"queue {name!r} is listed twice")
        digits = number.isascii() and number.isdigit() and len(number) <= 7
        if not (digits and 1 <= int(number) <= _TYPE_LIMIT_MAX):
            raise ValueError(
                f"the limit of queue {name!r} must be an integer from 1 to {_TYPE_LIMIT_MAX}"
            )
        limits[name] = int(number)
    return limits


def key_limits_of(limits: Mapping[str, int], queues: Iterable[str]) -> dict[str, int]:
    """Per queue of `queues`, its KEY_CONCURRENCY (its own entry, else `*`'s), where it has
    one."""
    found = {queue: limits.get(queue, limits.get("*")) for queue in queues}
    return {queue: n for queue, n in found.items() if n is not None}
