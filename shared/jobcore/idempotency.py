"""Idempotency, reconciled in Python: which items of a batch a statement inserts, and each
item's result (created, replayed or conflict) from what the database returned. Pure."""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from typing import Any
from uuid import UUID

from jobcore.rows import NewJob, Row, Submitted


def same_request(a: NewJob, b: NewJob) -> bool:
    """What the idempotency comparison compares (not when the job is due)."""
    return (
        a.type,
        a.max_attempts,
        a.queue,
        a.priority,
        a.timeout,
        a.concurrency_key,
        _canonical(a.payload),
    ) == (
        b.type,
        b.max_attempts,
        b.queue,
        b.priority,
        b.timeout,
        b.concurrency_key,
        _canonical(b.payload),
    )


def _canonical(value: Any) -> Any:
    """A form that compares like jsonb: key order ignored, true distinct from 1."""
    if isinstance(value, dict):
        return ("o", frozenset((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("a", tuple(_canonical(v) for v in value))
    if isinstance(value, bool) or value is None:
        return ("l", value)
    return ("v", value)


def batch_rows(new_jobs: Sequence[NewJob]) -> tuple[list[NewJob], dict[str, NewJob]]:
    """What a batch inserts: every item without an idempotency key and the first item of
    each key (later ones are replays of it or conflicts); and those first items by key."""
    first: dict[str, NewJob] = {}
    rows: list[NewJob] = []
    for new in new_jobs:
        key = new.idempotency_key
        if key is None or key not in first:
            rows.append(new)
            if key is not None:
                first[key] = new
    return rows, first


def returned_by_key(returned: Iterable[Row]) -> dict[str, tuple[UUID, bool]]:
    """JOB_SUBMIT_MANY's rows (id, idempotency_key, created): each key's job and whether this
    statement created it."""
    return {
        row["idempotency_key"]: (row["id"], bool(row["created"]))
        for row in returned
        if row["idempotency_key"] is not None
    }


def to_compare(
    new_jobs: Sequence[NewJob], by_key: Container[str], encode: Callable[[Any], str]
) -> tuple[list[NewJob], list[str]]:
    """The items (and their payloads, as `encode` writes them) whose key JOB_SUBMIT_MANY
    created nothing for: each key names a job stored before, which JOB_MATCH_REQUESTS reads
    and compares with every such item in the database (payloads as jsonb, as a single
    submit's statement compares them): as if sent one after another, each is a replay of
    the stored job or a conflict."""
    picked = [
        new
        for new in new_jobs
        if new.idempotency_key is not None and new.idempotency_key not in by_key
    ]
    return picked, [encode(new.payload) for new in picked]


def matched_by_item(rows: Iterable[Row]) -> dict[UUID, tuple[UUID, bool]]:
    """JOB_MATCH_REQUESTS's rows: per item (its id), the stored job its key names and whether
    that job holds the same request."""
    return {row["item"]: (row["id"], bool(row["same"])) for row in rows}


def batch_results(
    new_jobs: Sequence[NewJob],
    first: Mapping[str, NewJob],
    by_key: Mapping[str, tuple[UUID, bool]],
    matched: Mapping[UUID, tuple[UUID, bool]],
) -> list[Submitted]:
    """Each item's result, in input order: created, replayed or conflict. An item whose key
    this batch created a job for is compared with the key's first item; one whose key names
    a job stored before, with that job (`matched`)."""
    out: list[Submitted] = []
    for new in new_jobs:
        key = new.idempotency_key
        if key is None:
            out.append(Submitted("created", new.id))
        elif key in by_key and same_request(new, first[key]):
            job_id, created = by_key[key]
            fresh = created and first[key] is new
            out.append(Submitted("created" if fresh else "replayed", job_id))
        elif key not in by_key and matched.get(new.id, (None, False))[1]:
            out.append(Submitted("replayed", matched[new.id][0]))
        else:
            out.append(Submitted("conflict", None))
    return out
