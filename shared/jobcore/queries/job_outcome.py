"""The writes that end or extend an attempt: each outcome (`JOB_SET_OUTCOME`), the
heartbeat's renewal, the release of a lost claim, and the recovery of expired leases.
Batched over (id, lease token) pairs and fenced by the token."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from jobcore.queries.common import (
    DELAYS,
    ERRORS,
    LEASES,
    ONE_SECOND,
    RESULTS,
    WOKE,
    c,
    errors_appended,
    finish_time,
    guard,
    status_literal,
    unless_cancelled,
    unnest,
)
from jobcore.schema import jobs
from jobcore.states import (
    ATTEMPT_OUTCOMES,
    FINISHED,
    UNHANDLED_DELAY_FIRST,
    UNHANDLED_DELAY_MAX,
    Operation,
    Status,
    out_of_attempts,
)


def _fenced(operation: Operation, o: Any, **values: Any) -> Any:
    """Apply `operation` to each (id, token) whose lease is still the current one; returns
    the (id, token) of each row it applied to."""
    targets = operation.targets
    finished: Any
    if len(targets) == 1:
        (target,) = targets
        status = status_literal(target)
        finished = sa.func.now() if target in FINISHED else sa.null()
    else:
        (target,) = targets - {Status.CANCELLED}
        status = unless_cancelled(target)
        finished = sa.case((c.cancel_requested_at.is_not(None), sa.func.now()))
    return (
        sa.update(jobs)
        .where(c.id == o.c.id, guard(operation), c.lease_token == o.c.token)
        .values(
            status=status,
            locked_until=sa.null(),
            finished_at=finished,
            updated_at=sa.func.now(),
            **values,
        )
        .returning(c.id, c.lease_token, WOKE)
    )


_o = unnest(**LEASES)


def _grown_delay() -> Any:
    """`jobcore.states.unhandled_delay` in SQL: seconds doubling from UNHANDLED_DELAY_FIRST
    to UNHANDLED_DELAY_MAX with the entries `errors` already holds for this attempt's number.
    A give-back does not spend the attempt, so each one of the same attempt adds an entry
    of that number; any other failure of it moves the next attempt's number on."""
    before = sa.func.jsonb_path_query_array(
        sa.func.coalesce(c.errors, sa.literal_column("'[]'::jsonb")),
        sa.literal_column("'$[*] ? (@.attempt == $n)'::jsonpath"),
        sa.func.jsonb_build_object(sa.literal_column("'n'"), c.attempts),
    )
    # Literals, not parameters: the constants are part of the statement.
    exponent = sa.func.least(sa.func.jsonb_array_length(before), sa.literal_column("16"))
    doubled: Any = sa.literal_column(f"{UNHANDLED_DELAY_FIRST!r}") * sa.func.power(
        sa.literal_column("2"), exponent
    )
    return sa.func.least(doubled, sa.literal_column(f"{UNHANDLED_DELAY_MAX!r}"))


def _set_outcome(operation: Operation) -> Any:
    """`operation`'s write, from its declared effects: parameters `ids` and `tokens`, and
    `errors` and `tracebacks` (writes_error: NULL for no traceback), `delays` (due_again,
    unless delay_grows: seconds until the job is due again) and `results` (writes_result:
    JSON text, NULL for None)."""
    o = unnest(
        **LEASES,
        **(ERRORS if operation.writes_error else {}),
        **(DELAYS if operation.due_again and not operation.delay_grows else {}),
        **(RESULTS if operation.writes_result else {}),
    )
    values: dict[str, Any] = {}
    if operation.writes_result:  # a success: no error left from an earlier attempt
        values.update(last_error=sa.null(), result=sa.cast(o.c.result, pg.JSONB))
    if operation.writes_error:
        # `attempts` is the row's value before this write: the attempt that failed.
        values["last_error"] = o.c.error
        values["errors"] = errors_appended(c.attempts, o.c.error, o.c.traceback)
    if operation.gives_back:
        values["attempts"] = c.attempts - 1
    if operation.due_again:
        delay = _grown_delay() if operation.delay_grows else o.c.delay
        values["run_at"] = sa.func.now() + delay * ONE_SECOND
    return _fenced(operation, o, **values)


# Outcome writes, batched and fenced, one per operation that ends an attempt.
JOB_SET_OUTCOME: dict[Operation, Any] = {op: _set_outcome(op) for op in ATTEMPT_OUTCOMES}
if set(JOB_SET_OUTCOME) != set(ATTEMPT_OUTCOMES):
    raise RuntimeError("every operation that ends an attempt needs its outcome write")

# Heartbeats: the leases of running attempts extended by `lease_seconds` from now(), fenced
# like an outcome write. Each row is one the statement found (id, token, whether a cancel
# was requested, in case the announcement never reached the holder) and whether it was
# renewed: a row another transaction holds locked (an operator's `SELECT ... FOR UPDATE`, a
# replay of the job's idempotency key in an open transaction) is skipped, not waited for,
# so one locked row cannot cost every other lease of the batch its renewal; its lease keeps
# its time, and the next heartbeat tries again. A lease it does not return at all was lost
# (expired and recovered, or re-claimed), and its attempt must stop.
_renewable = sa.select(c.id, c.lease_token).where(
    c.id == _o.c.id, guard(Operation.RENEW), c.lease_token == _o.c.token
)
# FOR NO KEY UPDATE, the lock the UPDATE itself takes: a row held FOR SHARE or FOR KEY
# SHARE (a foreign key of the caller's own table checked in an open transaction) is renewed.
_unlocked = _renewable.with_for_update(of=jobs, skip_locked=True, key_share=True).cte("unlocked")
_CANCEL = c.cancel_requested_at.is_not(None).label("cancel")
_renewed = (
    sa.update(jobs)
    .where(
        c.id == _unlocked.c.id,
        guard(Operation.RENEW),
        c.lease_token == _unlocked.c.lease_token,
    )
    .values(locked_until=sa.func.now() + sa.bindparam("lease_seconds", type_=sa.Float) * ONE_SECOND)
    .returning(c.id, c.lease_token, _CANCEL)
    .cte("renewed")
)
# The renewed leases, then those still held but skipped: only the leases not renewed are
# read a second time (none, but for a locked row), so a renewal costs one read per lease.
JOB_RENEW_MANY = sa.union_all(
    sa.select(_renewed.c.id, _renewed.c.lease_token, _renewed.c.cancel, sa.true().label("renewed")),
    _renewable.add_columns(_CANCEL, sa.false()).where(
        _o.c.id.not_in(sa.select(_renewed.c.id).scalar_subquery())
    ),
)

# A claim whose answer never reached its worker (the call timed out or its connection
# broke after the statement was sent) may still have committed: the jobs it took are
# handed back, attempt given back, by the claim's id. Nobody else can hold them: only
# that claim set this id, and a later claim would have replaced it.
JOB_RELEASE_CLAIM = (
    sa.update(jobs)
    .where(
        guard(Operation.RELEASE_CLAIM),
        c.claim_id == sa.any_(sa.bindparam("claim_ids", type_=pg.ARRAY(pg.UUID(as_uuid=True)))),
    )
    .values(
        status=unless_cancelled(Status.PENDING),
        attempts=c.attempts - 1,
        locked_until=sa.null(),
        finished_at=sa.case((c.cancel_requested_at.is_not(None), sa.func.now())),
        updated_at=sa.func.now(),
    )
    .returning(c.id, WOKE)
)


# At most this many jobs per statement, so that recovery after a long outage stays within
# the worker's statement timeout and holds its row locks briefly; the loop repeats it.
RECOVER_BATCH = 1000
# `window`: only leases that ran out at most that many seconds ago (NULL: any). A lease the
# previous run saw expire it took back, so the worker reads from there (and now and then
# from the head, see `jobcore.floors`): the lease index's dead entries, one per attempt
# that ended while a held MVCC horizon keeps them, lie further back.
_RECENT = sa.func.coalesce(
    sa.func.now() - sa.bindparam("window", type_=sa.Float) * ONE_SECOND,
    sa.literal_column("CAST('-infinity' AS timestamptz)"),
)
_expired = (
    sa.select(c.id)
    .where(
        guard(Operation.RECOVER_EXPIRED),
        c.locked_until < sa.func.now(),
        c.locked_until >= _RECENT,
    )
    .order_by(c.locked_until)
    .limit(RECOVER_BATCH)
    .with_for_update(skip_locked=True)
    .cte("expired")
    .prefix_with("MATERIALIZED")
)
# A job whose cancel was requested ends cancelled; else it runs again if it has attempts left.
# Either way the lost attempt is one that failed, without a traceback (nothing raised).
_LEASE_EXPIRED = sa.func.concat("lease expired during attempt ", c.attempts)
_RECOVERED = sa.case(
    (c.cancel_requested_at.is_not(None), status_literal(Status.CANCELLED)),
    (out_of_attempts(c.attempts, c.max_attempts), status_literal(Status.DEAD_LETTER)),
    else_=status_literal(Status.PENDING),
)
JOB_RECOVER_EXPIRED = (
    sa.update(jobs)
    .where(c.id == sa.any_(sa.func.array(sa.select(_expired.c.id).scalar_subquery())))
    .values(
        status=_RECOVERED,
        locked_until=sa.null(),
        last_error=_LEASE_EXPIRED,
        errors=errors_appended(c.attempts, _LEASE_EXPIRED, sa.null()),
        finished_at=finish_time(_RECOVERED),
        updated_at=sa.func.now(),
    )
    .returning(c.id, c.status, WOKE)
)
