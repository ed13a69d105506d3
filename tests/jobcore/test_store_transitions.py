"""Every store operation against a job in every status: the store accepts exactly
the transitions of SPEC §3 and rejects (matches zero rows for) everything else."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from jobcore import store
from jobcore.ids import new_id
from jobcore.schema import jobs
from jobcore.states import Status
from tests.jobcore.test_states import SPEC_TRANSITIONS, C, D, F, P, R

# (operation, from) -> to, per SPEC §3. Anything not listed must leave the job unchanged.
EXPECTED = {
    ("claim", P): R,
    ("complete", R): C,
    ("retry_later", R): P,
    ("release", R): P,
    ("release_claim", R): P,
    ("fail", R): F,
    ("dead_letter", R): D,
    ("recover_expired", R): P,  # attempts left
    ("recover_expired_last", R): D,  # the lost attempt was the last
    ("manual_retry", D): P,
}
TOKEN = 7
CLAIM_ID = new_id()  # the claim that took every job made here


async def _job_in(conn, status: Status, *, last_attempt: bool) -> store.Lease:
    job_id = new_id()
    await conn.execute(
        sa.insert(jobs).values(
            id=job_id,
            type="sleep",
            payload={},
            status=status.value,
            attempts=3 if last_attempt else 1,
            max_attempts=3,
            lease_token=TOKEN,
            claim_id=CLAIM_ID,
            # Leases in the past, so recover_expired sees them as expired.
            locked_until=sa.func.now() - sa.text("interval '1 minute'") if status is R else None,
        )
    )
    return store.Lease(job_id, TOKEN)


async def _apply(conn, operation: str, lease: store.Lease) -> None:
    if operation == "claim":
        await store.claim(conn, 10, 60)
    elif operation in ("complete", "release"):
        await getattr(store, operation)(conn, [lease])
    elif operation in ("fail", "dead_letter"):
        await getattr(store, operation)(conn, [lease], ["boom"])
    elif operation == "retry_later":
        await store.retry_later(conn, [lease], ["boom"], [0.0])
    elif operation.startswith("recover_expired"):
        await store.recover_expired(conn)
    elif operation == "manual_retry":
        await store.manual_retry(conn, lease.job_id)
    elif operation == "release_claim":
        await store.release_claim(conn, [CLAIM_ID])
    else:  # pragma: no cover - a new operation must be added to this test
        raise AssertionError(operation)


OPERATIONS = sorted({op for op, _ in EXPECTED} | {"claim"})


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_store_accepts_exactly_the_spec_transitions(engine, operation):
    observed = set()
    for status in Status:
        async with engine.begin() as conn:
            await conn.execute(sa.delete(jobs))
            lease = await _job_in(conn, status, last_attempt=operation.endswith("_last"))
            await _apply(conn, operation, lease)
            after = Status(await conn.scalar(sa.select(jobs.c.status)))
        expected = EXPECTED.get((operation, status), status)
        assert after == expected, f"{operation} on {status}: got {after}, want {expected}"
        if after != status:
            observed.add((status, after))
    for status_from, status_to in observed:
        assert (status_from, status_to) in SPEC_TRANSITIONS


async def test_all_spec_transitions_are_reachable_through_the_store(engine):
    reached = set()
    for (operation, status), target in EXPECTED.items():
        async with engine.begin() as conn:
            await conn.execute(sa.delete(jobs))
            lease = await _job_in(conn, status, last_attempt=operation.endswith("_last"))
            await _apply(conn, operation, lease)
            assert Status(await conn.scalar(sa.select(jobs.c.status))) == target
        reached.add((status, target))
    assert reached == SPEC_TRANSITIONS


@pytest.mark.parametrize("operation", ["complete", "fail", "dead_letter", "retry_later", "release"])
async def test_outcome_write_with_another_token_is_rejected(engine, operation):
    async with engine.begin() as conn:
        lease = await _job_in(conn, R, last_attempt=False)
        stale = store.Lease(lease.job_id, TOKEN - 1)
        await _apply(conn, operation, stale)
        assert await conn.scalar(sa.select(jobs.c.status)) == R.value


async def test_outcome_writes_report_the_lost_leases(engine):
    async with engine.begin() as conn:
        good = await _job_in(conn, R, last_attempt=False)
        other = await _job_in(conn, R, last_attempt=False)
        stale = store.Lease(other.job_id, TOKEN + 1)
        assert await store.complete(conn, [good, stale]) == [stale]
        assert await store.complete(conn, [good]) == [good]  # already completed


async def test_release_claim_gives_the_attempt_back_only_to_that_claims_jobs(engine):
    async with engine.begin() as conn:
        lease = await _job_in(conn, R, last_attempt=True)
        assert await store.release_claim(conn, [new_id()]) == []  # another claim's id
        assert await store.release_claim(conn, [CLAIM_ID]) == [lease.job_id]
        row = (await conn.execute(sa.select(jobs))).mappings().one()
    assert (row["status"], row["attempts"], row["locked_until"]) == ("pending", 2, None)


async def test_release_gives_the_attempt_back_and_keeps_the_token(engine):
    async with engine.begin() as conn:
        lease = await _job_in(conn, R, last_attempt=False)
        assert await store.release(conn, [lease]) == []
        row = (await conn.execute(sa.select(jobs))).mappings().one()
    assert (row["status"], row["attempts"], row["lease_token"]) == ("pending", 0, TOKEN)
    assert row["locked_until"] is None
