"""Idempotency, reconciled in Python: which items of a batch a statement inserts, and each
item's result (created, replayed or conflict) from what the database returned. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from uuid import UUID

from jobcore.rows import NewJob, Row, Submitted


def same_request(a: NewJob, b: NewJob) -> bool:
    """What the idempotency comparison compares (not when the job is due)."""
    return (a.type, a.max_attempts, a.queue, a.priority, a.timeout, _canonical(a.payload)) == (
        b.type,
        b.max_attempts,
        b.queue,
        b.priority,
        b.timeout,
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


def keys_to_compare(first: Mapping[str, NewJob], by_key: Mapping[str, Any]) -> list[str]:
    """Keys for which JOB_SUBMIT_MANY returned no row: each names a job stored before (its
    first item and any later ones are replays of it, or conflicts), so that job is read
    (JOB_GET_BY_KEYS) and compared."""
    return sorted(key for key in first if key not in by_key)


def stored_requests(rows: Iterable[Row]) -> dict[str, NewJob]:
    """JOB_GET_BY_KEYS's rows as the requests they stored, by key."""
    return {
        row["idempotency_key"]: NewJob(
            row["id"],
            row["type"],
            row["payload"],
            row["max_attempts"],
            row["idempotency_key"],
            row["queue"],
            row["priority"],
            timeout=row["timeout"],
        )
        for row in rows
    }


def batch_results(
    new_jobs: Sequence[NewJob],
    first: Mapping[str, NewJob],
    by_key: Mapping[str, tuple[UUID, bool]],
    stored: Mapping[str, NewJob],
) -> list[Submitted]:
    """Each item's result, in input order: created, replayed or conflict."""
    out: list[Submitted] = []
    for new in new_jobs:
        key = new.idempotency_key
        if key is None:
            out.append(Submitted("created", new.id))
        elif key in by_key and same_request(new, first[key]):
            job_id, created = by_key[key]
            fresh = created and first[key] is new
            out.append(Submitted("created" if fresh else "replayed", job_id))
        elif key in stored and same_request(new, stored[key]):
            out.append(Submitted("replayed", stored[key].id))
        else:
            out.append(Submitted("conflict", None))
    return out
