"""Every store operation against a job in every status, through the calls the worker and
the API make: the store accepts exactly the documented transitions (README, "Job
lifecycle") and rejects (matches zero rows for) everything else."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from jobcore import compiled, control
from jobcore.ids import new_id
from jobcore.rows import Lease, Renewed
from jobcore.schema import jobs
from jobcore.states import ATTEMPT_OUTCOMES, Operation, Status
from tests.jobcore.test_states import DOCUMENTED_TRANSITIONS, C, D, F, P, R, X
from tests.pg import driver

# (operation, from) -> to, as documented. Anything not listed must leave the job unchanged.
EXPECTED = {
    ("claim", P): R,
    ("complete", R): C,
    ("retry_later", R): P,
    ("release", R): P,
    ("release_claim", R): P,
    ("snooze", R): P,
    ("unhandled", R): P,
    ("fail", R): F,
    ("dead_letter", R): D,
    ("recover_expired", R): P,  # attempts left
    ("recover_expired_last", R): D,  # the lost attempt was the last
    ("manual_retry", D): P,
    ("manual_retry", F): P,
    ("manual_retry", X): P,
    ("cancel", P): X,
    ("cancel", D): X,
    ("cancel_attempt", R): X,
    # A cancel was requested: what would let the job run again ends it cancelled instead.
    ("retry_later_cancelling", R): X,
    ("snooze_cancelling", R): X,
    ("unhandled_cancelling", R): X,
    ("release_cancelling", R): X,
    ("release_claim_cancelling", R): X,
    ("recover_expired_cancelling", R): X,
    ("recover_expired_last_cancelling", R): X,
    # ... and what ends it otherwise stands.
    ("complete_cancelling", R): C,
    ("fail_cancelling", R): F,
    ("dead_letter_cancelling", R): D,
}
TOKEN = 7
CLAIM_ID = new_id()  # the claim that took every job made here


async def _job_in(conn, status: Status, operation: str) -> Lease:
    """A job in `status`; on its last attempt for `..._last` operations, and with a cancel
    requested for `..._cancelling` ones."""
    job_id = new_id()
    await conn.execute(
        sa.insert(jobs).values(
            id=job_id,
            type="sleep",
            payload={},
            status=status.value,
            attempts=3 if "_last" in operation else 1,
            max_attempts=3,
            lease_token=TOKEN,
            claim_id=CLAIM_ID,
            # Leases in the past, so recover_expired sees them as expired.
            locked_until=sa.func.now() - sa.text("interval '1 minute'") if status is R else None,
            cancel_requested_at=sa.func.now() if operation.endswith("_cancelling") else None,
        )
    )
    return Lease(job_id, TOKEN)


async def _apply(conn, operation: str, lease: Lease) -> None:
    """`operation` through the call the worker (or, for manual_retry, the API) makes."""
    raw = await driver(conn)
    op = Operation(operation.removesuffix("_cancelling").removesuffix("_last"))
    if op is Operation.CLAIM:
        await compiled.claim(raw, {"default": 10}, 60)
    elif op in ATTEMPT_OUTCOMES:
        await compiled.record(raw, op, [lease], ["boom"], [0.0])
    elif op is Operation.RECOVER_EXPIRED:
        await compiled.recover_expired(raw)
    elif op is Operation.RELEASE_CLAIM:
        await compiled.release_claim(raw, [CLAIM_ID])
    elif op is Operation.RENEW:
        await compiled.renew(raw, [lease], 60)
    elif op is Operation.MANUAL_RETRY:
        await control.manual_retry(conn, lease.job_id)
    elif op is Operation.CANCEL:
        await conn.execute(control.JOB_CANCEL, {"job_id": lease.job_id})
    elif op is Operation.REQUEST_CANCEL:
        await conn.execute(control.JOB_REQUEST_CANCEL, {"job_id": lease.job_id})
    else:  # pragma: no cover - a new operation must be added to this test
        raise AssertionError(operation)


# Every declared operation, recovery once more for a lost last attempt, and each with a
# cancel requested where that changes or must not change the outcome.
OPERATIONS = [
    *Operation,
    "recover_expired_last",
    *sorted({operation for operation, _ in EXPECTED if operation.endswith("_cancelling")}),
]


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_store_accepts_exactly_the_documented_transitions(engine, operation):
    observed = set()
    for status in Status:
        async with engine.begin() as conn:
            await conn.execute(sa.delete(jobs))
            lease = await _job_in(conn, status, operation)
            await _apply(conn, operation, lease)
            after = Status(await conn.scalar(sa.select(jobs.c.status)))
        expected = EXPECTED.get((operation, status), status)
        assert after == expected, f"{operation} on {status}: got {after}, want {expected}"
        if after != status:
            observed.add((status, after))
    for status_from, status_to in observed:
        assert (status_from, status_to) in DOCUMENTED_TRANSITIONS


async def test_every_documented_transition_is_reachable_through_the_store(engine):
    reached = set()
    for (operation, status), target in EXPECTED.items():
        async with engine.begin() as conn:
            await conn.execute(sa.delete(jobs))
            lease = await _job_in(conn, status, operation)
            await _apply(conn, operation, lease)
            assert Status(await conn.scalar(sa.select(jobs.c.status))) == target
        reached.add((status, target))
    assert reached == DOCUMENTED_TRANSITIONS


@pytest.mark.parametrize("operation", ATTEMPT_OUTCOMES)
async def test_outcome_write_with_another_token_is_rejected(engine, operation):
    async with engine.begin() as conn:
        lease = await _job_in(conn, R, "")
        stale = Lease(lease.job_id, TOKEN - 1)
        await _apply(conn, operation, stale)
        assert await conn.scalar(sa.select(jobs.c.status)) == R.value


async def test_outcome_writes_report_the_lost_leases(engine):
    async with engine.begin() as conn:
        raw = await driver(conn)
        good = await _job_in(conn, R, "")
        other = await _job_in(conn, R, "")
        stale = Lease(other.job_id, TOKEN + 1)
        assert await compiled.record(raw, Operation.COMPLETE, [good, stale]) == [stale]
        assert await compiled.record(raw, Operation.COMPLETE, [good]) == [good]  # already completed


async def test_release_claim_gives_the_attempt_back_only_to_that_claims_jobs(engine):
    async with engine.begin() as conn:
        raw = await driver(conn)
        lease = await _job_in(conn, R, "_last")
        assert await compiled.release_claim(raw, [new_id()]) == []  # another claim's id
        assert await compiled.release_claim(raw, [CLAIM_ID]) == [lease.job_id]
        row = (await conn.execute(sa.select(jobs))).mappings().one()
    assert (row["status"], row["attempts"], row["locked_until"]) == ("pending", 2, None)


async def test_release_gives_the_attempt_back_and_keeps_the_token(engine):
    async with engine.begin() as conn:
        raw = await driver(conn)
        lease = await _job_in(conn, R, "")
        assert await compiled.record(raw, Operation.RELEASE, [lease]) == []
        row = (await conn.execute(sa.select(jobs))).mappings().one()
    assert (row["status"], row["attempts"], row["lease_token"]) == ("pending", 0, TOKEN)
    assert row["locked_until"] is None


async def test_a_finished_job_carries_its_finish_time_and_a_retried_one_loses_it(engine):
    async with engine.begin() as conn:
        raw = await driver(conn)
        lease = await _job_in(conn, R, "")
        assert await compiled.record(raw, Operation.COMPLETE, [lease], results=['{"n": 1}']) == []
        row = (await conn.execute(sa.select(jobs))).mappings().one()
        assert row["finished_at"] is not None and row["result"] == {"n": 1}
    async with engine.begin() as conn:
        await conn.execute(sa.update(jobs).values(status=D.value))
        await control.manual_retry(conn, lease.job_id)
        row = (await conn.execute(sa.select(jobs))).mappings().one()
    assert (row["status"], row["finished_at"], row["result"]) == ("pending", None, None)


async def test_a_cancel_request_marks_a_running_job_and_keeps_the_first_request_time(engine):
    async with engine.begin() as conn:
        lease = await _job_in(conn, R, "")
        first = await control.cancel(conn, lease.job_id)
    async with engine.begin() as conn:
        again = await control.cancel(conn, lease.job_id)
    assert first is not None and again is not None
    assert first[1] == again[1] == control.Cancelled.REQUESTED
    assert first[0].status == R and first[0].cancel_requested_at is not None
    assert again[0].cancel_requested_at == first[0].cancel_requested_at


async def test_a_renewal_tells_the_holder_that_a_cancel_was_requested(engine):
    async with engine.begin() as conn:
        raw = await driver(conn)
        plain = await _job_in(conn, R, "")
        asked = await _job_in(conn, R, "_cancelling")
        renewed = await compiled.renew(raw, [plain, asked], 60)
    assert renewed == Renewed(lost=[], cancel=[asked], busy=[])


async def test_a_renewal_skips_a_row_another_transaction_holds_locked_and_renews_the_rest(engine):
    """One locked row (an operator's SELECT ... FOR UPDATE, an open transaction replaying
    the job's idempotency key) must not hold up the whole batch until the lock goes, nor
    count as lost: the others are renewed at once and the locked one is reported busy."""
    async with engine.begin() as conn:
        leases = [await _job_in(conn, R, "") for _ in range(3)]
    locked = leases[1]
    async with engine.connect() as holder, engine.connect() as renewer:
        await holder.begin()
        await holder.execute(
            sa.select(jobs.c.id).where(jobs.c.id == locked.job_id).with_for_update()
        )
        raw = await driver(renewer)
        async with asyncio.timeout(5):  # the old statement waited for the lock forever
            renewed = await compiled.renew(raw, leases, 600)
        assert renewed == Renewed(lost=[], cancel=[], busy=[locked])
        rows = await renewer.execute(
            sa.select(
                jobs.c.id, jobs.c.locked_until > sa.func.now() + sa.text("interval '500 s'")
            ).where(jobs.c.id.in_([lease.job_id for lease in leases]))
        )
        extended = dict(rows.all())
        await holder.rollback()
    assert extended == {leases[0].job_id: True, locked.job_id: False, leases[2].job_id: True}
