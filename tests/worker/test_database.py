"""PgJobStore on the real PostgreSQL: its statements have exactly jobcore.store's effects;
through a fault proxy, outages are logged once per change of state, and a connection that
goes silent times out instead of hanging."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from jobcore import compiled
from jobcore.db import make_engine
from jobcore.floors import LEASE_MARGIN, micros
from jobcore.ids import new_id
from jobcore.rows import Lease, TypeLimits
from jobcore.schema import jobs
from jobcore.states import Operation, Status
from jobcore.turns import KeyedQueues
from jobqueue_worker import database
from jobqueue_worker.database import (
    IDLE_IN_TRANSACTION,
    LOCK_TIMEOUT,
    STATEMENT_TIMEOUT,
    Availability,
    PgJobStore,
)
from tests.faultproxy import FaultProxy
from tests.jobcore.test_store_transitions import _job_in
from tests.pg import driver
from tests.worker.support import submit


def _messages(caplog: pytest.LogCaptureFixture, msg: str) -> int:
    return sum(1 for r in caplog.records if r.getMessage() == msg)


async def test_database_outage_is_logged_once_per_change_of_state(database_url, engine, caplog):
    (job,) = await submit(engine, "sleep", {"duration": "0s"})
    with FaultProxy.to_database(database_url) as proxy:
        proxied = make_engine(proxy.database_url(database_url), pool_size=2, connect_timeout=2)
        store = PgJobStore(proxied)
        try:
            with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
                assert await store.recover_expired() == []
                proxy.refuse()
                proxy.cut()
                for _ in range(3):
                    with pytest.raises(Exception):  # noqa: B017 - any driver error will do
                        await store.claim({"default": 1}, 60)
                assert _messages(caplog, "database unavailable") == 1
                proxy.pass_through()
                claimed = await store.claim({"default": 1}, 60)
                await store.claim({"default": 1}, 60)
            assert _messages(caplog, "database unavailable") == 1
            assert _messages(caplog, "database available again") == 1
        finally:
            await store.close()
            await proxied.dispose()
    assert [c.id for c in claimed] == [job]


async def test_a_silent_connection_times_out_and_the_store_recovers(
    database_url, engine, monkeypatch
):
    monkeypatch.setattr(database, "CALL_TIMEOUT", 1.0)
    (job,) = await submit(engine, "sleep", {"duration": "0s"})
    with FaultProxy.to_database(database_url) as proxy:
        proxied = make_engine(proxy.database_url(database_url), pool_size=2, connect_timeout=1)
        store = PgJobStore(proxied)
        try:
            await store.recover_expired()  # a pooled connection, open before the fault
            proxy.blackhole()
            with pytest.raises(TimeoutError):
                await store.claim({"default": 1}, 60)
            proxy.pass_through()
            claimed = await store.claim({"default": 1}, 60)
        finally:
            await store.close()
            await proxied.dispose()
    assert [c.id for c in claimed] == [job]


def test_a_call_begun_before_the_last_success_does_not_report_an_outage(caplog):
    availability = Availability(clock=lambda: 0.0)
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        availability.failed("claim", ConnectionError("refused"), started=1.0)
        availability.succeeded(started=3.0)
        # This call hung on a connection broken during the outage; it says nothing new.
        availability.failed("complete", TimeoutError(), started=2.0)
        assert availability.up
        availability.failed("claim", ConnectionError("refused"), started=4.0)
    assert [r.getMessage() for r in caplog.records] == [
        "database unavailable",
        "database available again",
        "database unavailable",
    ]


async def test_the_worker_store_decodes_payloads_as_submitted(engine):
    payload = {"nested": [1, "two", None], "n": 1.5, "s": "é"}
    (job_id,) = await submit(engine, "sleep", payload)
    pg = PgJobStore(engine)
    try:
        (claimed,) = await pg.claim({"default": 1}, 60)
    finally:
        await pg.close()
    assert (claimed.id, claimed.payload) == (job_id, payload)


async def test_the_worker_store_reports_exactly_the_lost_leases(engine):
    pg = PgJobStore(engine)
    try:
        async with engine.begin() as conn:
            good = await _job_in(conn, Status.PROCESSING, "complete")
            other = await _job_in(conn, Status.PROCESSING, "complete")
        stale = Lease(other.job_id, other.lease_token + 1)
        assert await pg.record(Operation.COMPLETE, [good, stale]) == [stale]
        assert await pg.record(Operation.COMPLETE, [good]) == [good]  # already completed
        async with engine.connect() as conn:
            status = await conn.scalar(sa.select(jobs.c.status).where(jobs.c.id == other.job_id))
        assert status == "processing"  # the stale write changed nothing
    finally:
        await pg.close()


def _uuid(i: int) -> uuid.UUID:
    return uuid.UUID(int=i + 1)


async def _mixed_jobs(engine) -> dict[str, Lease]:
    """Jobs in the states a completing write meets: fresh and stale leases, due and not due."""
    async with engine.begin() as conn:
        await conn.execute(sa.delete(jobs))
        rows = [
            ("mine-1", "processing", 0),
            ("mine-2", "processing", 0),
            ("taken-over", "processing", 0),  # re-claimed since: our token is stale
            ("due-1", "pending", -30),
            ("due-2", "pending", -20),
            ("due-3", "pending", -10),
            ("due-4", "pending", -5),
            ("later", "pending", 3600),
            ("dead", "dead_letter", 0),
        ]
        leases = {}
        for i, (label, status, run_in) in enumerate(rows):
            await conn.execute(
                sa.insert(jobs).values(
                    id=_uuid(i),
                    type="sleep",
                    payload={"label": label},
                    status=status,
                    attempts=1 if status == "processing" else 0,
                    max_attempts=3,
                    lease_token=7,
                    run_at=sa.func.now() + sa.text(f"interval '{run_in} seconds'"),
                    locked_until=sa.func.now() + sa.text("interval '1 minute'")
                    if status == "processing"
                    else None,
                )
            )
            leases[label] = Lease(_uuid(i), 7)
        leases["taken-over"] = Lease(leases["taken-over"].job_id, 6)
    return leases


async def _state(engine) -> list[tuple]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.select(jobs.c.id, jobs.c.status, jobs.c.attempts, jobs.c.lease_token).order_by(
                jobs.c.id
            )
        )
        return [tuple(row) for row in rows]


async def test_complete_and_claim_is_complete_then_claim_in_one_statement(engine):
    """The reference is complete then claim in one transaction; the combined statement
    (PgJobStore's) must have exactly its effect and results."""
    outcomes = []
    for way in ("reference", "worker"):
        leases = await _mixed_jobs(engine)
        mine = [leases["mine-1"], leases["taken-over"], leases["mine-2"]]
        if way == "worker":
            pg = PgJobStore(engine)
            try:
                lost, claimed = await pg.complete_and_claim(mine, {"default": 3}, 60)
            finally:
                await pg.close()
        else:
            async with engine.begin() as conn:
                await conn.execute(sa.select(1))  # the transaction has begun
                raw = await driver(conn)
                lost = await compiled.record(raw, Operation.COMPLETE, mine)
                claimed = await compiled.claim(raw, {"default": 3}, 60)
        labels = sorted(job.payload["label"] for job in claimed)
        # Each way has jobs of its own, due at times of their own.
        claimed = [dataclasses.replace(job, run_at=None) for job in claimed]
        outcomes.append(
            (lost, labels, claimed and sorted(claimed, key=lambda j: j.id), await _state(engine))
        )
    reference = outcomes[0]
    assert reference[0] == [leases["taken-over"]]
    assert reference[1] == ["due-1", "due-2", "due-3"]  # the oldest due, not the one not due
    assert outcomes[1] == reference


# The claims' floor parameters as literals, none: a claim from the head, as a sweep.
_NO_FLOORS = "'{}'::text[], '{}'::smallint[], '{}'::bigint[]"
# No key limits, then no floors, no turns, no overruns and no key lease floor: the claim's
# parameters after its slots.
_NO_KEYS = (
    f"'{{}}'::integer[], {_NO_FLOORS}, '{{}}'::text[], '{{}}'::smallint[], '{{}}'::text[],"
    " '{}'::text[], '{}'::text[], '{}'::integer[], NULL::bigint"
)


def _most_rows_from_one_scan(node: dict) -> int:
    """The most rows any one scan of the plan read (returned or filtered out)."""
    own = 0
    if "Scan" in node.get("Node Type", ""):
        own = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
    return max([own, *(_most_rows_from_one_scan(child) for child in node.get("Plans", []))])


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
@pytest.mark.parametrize("statement", ["claim", "complete_and_claim"])
async def test_a_claim_reads_about_the_rows_it_claims_even_with_statistics_from_a_quiet_moment(
    engine, statement, generic
):
    # Statistics taken while nothing was pending, then a burst: the planner believes the
    # claim index nearly empty. A plan that reaches the claimed rows through it reads every
    # pending job per claim.
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO jobqueue.jobs (id, type, payload, status, max_attempts) SELECT"
                " gen_random_uuid(), 'sleep', '{}', 'completed', 3 FROM generate_series(1, 300)"
            )
        )
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(sa.text("ANALYZE jobqueue.jobs"))
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO jobqueue.jobs (id, type, payload, max_attempts) SELECT"
                " gen_random_uuid(), 'sleep', '{}', 3 FROM generate_series(1, 5000)"
            )
        )
    sql = compiled.STATEMENTS[f"job_{statement}"].sql
    claim_args = f"1, 60, 1, NULL, 'test-host:1', '{{default}}', '{{50}}', {_NO_KEYS}"
    outcomes = "'{}'::uuid[], '{}'::bigint[], '{}'::text[]"
    args = claim_args if statement == "claim" else f"{outcomes}, {claim_args}"
    async with engine.connect() as conn:
        driver = (await conn.get_raw_connection()).driver_connection
        mode = "force_generic_plan" if generic else "force_custom_plan"
        await driver.execute(f"SET plan_cache_mode = {mode}")
        await driver.execute(f"PREPARE claim_now AS {sql}")
        plan = await driver.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim_now({args})")
        await driver.execute("DEALLOCATE claim_now")
        await conn.rollback()
    root = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    assert _most_rows_from_one_scan(root) <= 4 * 50, json.dumps(root, indent=1)


@pytest.mark.parametrize("statement", ["claim", "complete_and_claim"])
async def test_the_worker_plans_its_claims_for_the_table_as_it_is(engine, statement):
    # No statistics yet, and the statement prepared and run while the table was tiny: the
    # plans PostgreSQL would cache or choose then (a sequential scan by id, all pending
    # jobs sorted) read the whole table per claim once a burst has arrived.
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO jobqueue.jobs (id, type, payload, status, max_attempts) SELECT"
                " gen_random_uuid(), 'sleep', '{}', 'completed', 3 FROM generate_series(1, 300)"
            )
        )
    sql = compiled.STATEMENTS[f"job_{statement}"].sql

    def claim_args(n: int) -> str:
        args = f"1, 60, 1, NULL, 'test-host:1', '{{default}}', '{{{n}}}', {_NO_KEYS}"
        outcomes = "'{}'::uuid[], '{}'::bigint[], '{}'::text[]"
        return args if statement == "claim" else f"{outcomes}, {args}"

    small, burst = claim_args(1), claim_args(50)

    async def before(driver) -> None:
        await driver.execute(f"PREPARE claim_now AS {sql}")
        for _ in range(8):  # past the runs after which a generic plan may be kept
            await driver.execute(f"EXECUTE claim_now({small})")

    async def after(driver) -> str:
        plan = await driver.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim_now({burst})")
        await driver.execute("DEALLOCATE claim_now")
        return plan

    pg = PgJobStore(engine)
    try:
        # On the worker store's own connection, with the settings it plans with.
        await pg._run("test", before)
        async with engine.begin() as conn:
            await conn.execute(
                sa.text(
                    "INSERT INTO jobqueue.jobs (id, type, payload, max_attempts) SELECT"
                    " gen_random_uuid(), 'sleep', '{}', 3 FROM generate_series(1, 20000)"
                )
            )
        plan = await pg._run("test", after)
    finally:
        await pg.close()
    root = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    assert _most_rows_from_one_scan(root) <= 4 * 50, json.dumps(root, indent=1)


@pytest.mark.parametrize("combined", [False, True], ids=["complete", "complete_and_claim"])
async def test_an_old_and_a_new_lease_of_one_job_in_one_batch_report_the_old_one_lost(
    engine, combined
):
    async with engine.begin() as conn:
        current = await _job_in(conn, Status.PROCESSING, "complete")
    old = Lease(current.job_id, current.lease_token - 1)
    pg = PgJobStore(engine)
    try:
        if combined:
            lost, _ = await pg.complete_and_claim([old, current], {"default": 1}, 60)
        else:
            lost = await pg.record(Operation.COMPLETE, [old, current])
    finally:
        await pg.close()
    assert lost == [old]


async def _hold_row_lock(engine, job_id, release: asyncio.Event, locked: asyncio.Event) -> None:
    async with engine.begin() as conn:
        await conn.execute(sa.select(jobs.c.id).where(jobs.c.id == job_id).with_for_update())
        locked.set()
        await release.wait()


async def test_a_write_stuck_behind_a_lock_is_stopped_by_the_server_before_the_worker_gives_up(
    engine,
):
    """A write the worker gives up on must not go on in the server and claim jobs that no
    slot will ever run: the server's lock_timeout / statement_timeout end it first."""
    async with engine.begin() as conn:
        held = await _job_in(conn, Status.PROCESSING, "complete")
    pending = await submit(engine, "sleep", {"duration": "0s"}, max_attempts=1, count=3)
    release, locked = asyncio.Event(), asyncio.Event()
    locker = asyncio.create_task(_hold_row_lock(engine, held.job_id, release, locked))
    await locked.wait()
    pg = PgJobStore(engine)
    try:
        started = time.monotonic()
        with pytest.raises(asyncpg.PostgresError):  # the server's error, not the client's timeout
            await pg.complete_and_claim([held], {"default": 3}, 60)
        assert time.monotonic() - started < database.CALL_TIMEOUT
    finally:
        # Held past the client's limit: a statement still alive in the server would now
        # complete the job and claim the three.
        await asyncio.sleep(database.CALL_TIMEOUT - (time.monotonic() - started) + 0.5)
        release.set()
        await locker
        await pg.close()
    async with engine.connect() as conn:
        rows = dict((await conn.execute(sa.select(jobs.c.id, jobs.c.status))).all())
    assert rows[held.job_id] == "processing"
    assert [rows[job_id] for job_id in pending] == ["pending"] * 3


async def test_jobs_taken_by_a_claim_whose_answer_was_lost_are_handed_back_unspent(
    database_url, engine, monkeypatch
):
    # Each chunk held 0.5 s each way: the BEGIN's answer is back at 1 s, the claim's (its
    # statement prepared already) at 2 s, the COMMIT reaches the server at 2.5 s and its
    # answer would be back at 3 s. The call gives up in between.
    monkeypatch.setattr(database, "CALL_TIMEOUT", 2.75)
    with FaultProxy.to_database(database_url) as proxy:
        proxied = make_engine(proxy.database_url(database_url), pool_size=2, connect_timeout=2)
        pg = PgJobStore(proxied)
        # Its clock stands still: after the first claim (which looks for keys), every claim
        # is the plain one.
        pg.keyed = KeyedQueues(clock=lambda: 0.0)
        try:
            # A connection open before the fault, with the claim prepared on it.
            assert await pg.claim({"default": 3}, 60) == []
            assert await pg.claim({"default": 3}, 60) == []
            ids = await submit(engine, "sleep", {"duration": "0s"}, max_attempts=1, count=3)
            proxy.add_latency(0.5)  # the claim commits; the answer comes too late
            with pytest.raises(TimeoutError):
                await pg.claim({"default": 3}, 60)
            async with engine.connect() as conn:
                taken = (
                    await conn.execute(
                        sa.select(jobs.c.status, jobs.c.attempts).where(jobs.c.id.in_(ids))
                    )
                ).all()
            assert taken == [("processing", 1)] * 3
            proxy.pass_through()
            assert await pg.recover_expired() == []  # the next call hands them back first
        finally:
            await pg.close()
            await proxied.dispose()
    async with engine.connect() as conn:
        rows = (
            await conn.execute(sa.select(jobs.c.status, jobs.c.attempts).where(jobs.c.id.in_(ids)))
        ).all()
    assert rows == [("pending", 0)] * 3


# The server's defaults of the store's settings, as this suite's PostgreSQL has them.
DEFAULTS = {
    "plan_cache_mode": "auto",
    "enable_sort": "on",
    "enable_seqscan": "on",
    "jit_above_cost": "100000",
    "statement_timeout": "0",
    "lock_timeout": "0",
    "client_connection_check_interval": "0",
    "idle_in_transaction_session_timeout": "0",
    "synchronous_commit": "on",
}


async def _show(driver) -> dict[str, str]:
    return {name: await driver.fetchval(f"SHOW {name}") for name in DEFAULTS}


async def _one_transaction(driver) -> bool:
    """Whether two statements of a call share a transaction."""
    first = await driver.fetchval("SELECT txid_current()")
    return bool(first == await driver.fetchval("SELECT txid_current()"))


@pytest.mark.parametrize(("synchronous_commit", "expected"), [(True, "on"), (False, "off")])
async def test_the_store_settings_are_its_transactions_own_never_the_sessions(
    engine, synchronous_commit, expected
):
    """Every setting of the store's (WORKER_SYNCHRONOUS_COMMIT=off's included) holds in its
    calls' transactions, and in nothing else run on the same session: through a pooler in
    transaction mode, that session serves other clients next (the API's submits)."""
    store = PgJobStore(engine, synchronous_commit=synchronous_commit)
    try:
        assert await store.recover_expired() == []
        inside = await store._run("test", _show)
        assert await store._run("test", _one_transaction)
        (held,) = store._idle
        after = await _show(held[1])
    finally:
        await store.close()
    assert inside == {**DEFAULTS, **database.SETTINGS, "synchronous_commit": expected}
    assert after == DEFAULTS


async def test_a_session_that_has_the_settings_already_runs_its_calls_as_they_are(
    database_url, engine
):
    """The settings given to the worker's role (or, here, its database): its calls need no
    transaction of their own, two round trips fewer. WORKER_SYNCHRONOUS_COMMIT=off, which
    the database does not have, still gets one."""
    name = make_url(database_url).database
    async with engine.connect() as conn:
        for setting, value in database.SETTINGS.items():
            await conn.execute(sa.text(f"ALTER DATABASE \"{name}\" SET {setting} = '{value}'"))
        await conn.commit()
    preset = make_engine(database_url, pool_size=2, isolation_level="AUTOCOMMIT")
    try:
        for synchronous_commit, wrapped in ((True, False), (False, True)):
            store = PgJobStore(preset, synchronous_commit=synchronous_commit)
            try:
                assert await store.claim({"default": 1}, 60) == []
                assert await store._run("test", _one_transaction) is wrapped
                shown = await store._run("test", _show)
            finally:
                await store.close()
            assert shown == {
                **DEFAULTS,
                **database.SETTINGS,
                "synchronous_commit": "on" if synchronous_commit else "off",
            }
    finally:
        await preset.dispose()


async def test_the_store_recovers_every_expired_lease_in_time_windowed_or_swept(engine):
    """Recovery reads the leases that ran out since its last run; one that ran out long
    before (a run skipped it while another transaction held its row) a sweep takes."""
    pg = PgJobStore(engine)
    try:
        assert await pg.recover_expired() == []  # the first run reads from the head
        async with engine.begin() as conn:
            await conn.execute(
                sa.text(
                    "INSERT INTO jobqueue.jobs (id, type, payload, max_attempts, status, attempts,"
                    " lease_token, locked_until) SELECT gen_random_uuid(), 'sleep', '{}', 3,"
                    " 'processing', 1, 1, now() - i * interval '1 hour'"
                    " FROM generate_series(0, 2) AS i"
                )
            )
        recovered: list[object] = []
        deadline = time.monotonic() + 10
        while len(recovered) < 3:
            assert time.monotonic() < deadline, recovered
            recovered += await pg.recover_expired()
            await asyncio.sleep(0.05)
        assert len(set(recovered)) == 3
    finally:
        await pg.close()


async def _backlog(engine, count: int, key: str | None, seconds_ago: float) -> list[uuid.UUID]:
    ids = [new_id() for _ in range(count)]
    start = datetime.now(UTC) - timedelta(seconds=seconds_ago)
    async with engine.begin() as conn:
        await conn.execute(
            sa.insert(jobs),
            [
                {
                    "id": job_id,
                    "type": "sleep",
                    "payload": {},
                    "max_attempts": 3,
                    "concurrency_key": key,
                    "run_at": start + timedelta(milliseconds=n),
                }
                for n, job_id in enumerate(ids)
            ],
        )
    return ids


async def test_claims_are_plain_where_no_key_has_jobs_and_a_probe_finds_a_key_behind_a_backlog(
    engine,
):
    """The plain claim takes claim order alone; a key submitted behind a key-less backlog is
    not reached by it, but by the next claim with keys in turn (a probe, every KEYED_PROBE),
    and from then on the queue is claimed with keys in turn."""
    now = [0.0]
    store = PgJobStore(engine)
    store.keyed = KeyedQueues(clock=lambda: now[0])
    try:
        assert await store.claim({"default": 4}, 60) == []  # the first probe: nothing
        backlog = set(await _backlog(engine, 200, None, 60))
        keyed = set(await _backlog(engine, 3, "tenant-1", 30))
        now[0] = 0.5
        plain = await store.claim({"default": 4}, 60)
        assert {job.id for job in plain} <= backlog and len(plain) == 4  # claim order
        now[0] = 1.0  # the next probe: the key gets its turn
        probe = await store.claim({"default": 4}, 60)
        assert {job.id for job in probe} & keyed
        now[0] = 1.5  # keys in turn since: the key's others come before the backlog's
        after = await store.claim({"default": 4}, 60)
        assert keyed <= {job.id for job in probe + after}
    finally:
        await store.close()


async def test_under_key_concurrency_every_claim_has_keys_in_turn(engine):
    store = PgJobStore(engine, key_concurrency={"*": 1})
    store.keyed = KeyedQueues(clock=lambda: 0.0)
    try:
        assert await store.claim({"default": 4}, 60) == []
        await _backlog(engine, 20, None, 60)
        await _backlog(engine, 5, "tenant-1", 30)
        taken = await store.claim({"default": 8}, 60) + await store.claim({"default": 8}, 60)
    finally:
        await store.close()
    # Never two of the key at once, however many claims.
    assert [job.concurrency_key for job in taken].count("tenant-1") == 1


async def test_the_claims_learn_the_keys_floors_and_a_check_of_the_heads_lowers_them(engine):
    """A worker process's claims learn where each key's jobs begin (`ClaimFloors`), and
    while reading from the head is costly they read each known key from there: a job of
    the key handed back below its floor waits for a check of the heads (`check_floors`)."""
    store = PgJobStore(engine)
    store.keyed = KeyedQueues(clock=lambda: 0.0)
    try:
        await _backlog(engine, 2, "tenant-1", 0)
        assert len(await store.claim({"default": 4}, 60)) == 2
        assert store.floors.key_floor("default", 0, "tenant-1") is not None
        # As under a held horizon: the heads costly to read, claims do not sweep.
        store.floors.checked(1.0, store.availability.now(), keys=0, heads=1, entries=1000)
        await _backlog(engine, 1, "tenant-1", 3600)  # handed back: below the floor
        assert await store.claim({"default": 4}, 60) == []
        await store.check_floors(["default"])
        store.floors.checked(1.0, store.availability.now(), keys=0, heads=1, entries=1000)
        (late,) = await store.claim({"default": 4}, 60)
        assert late.concurrency_key == "tenant-1"
    finally:
        await store.close()


async def test_under_key_concurrency_a_check_sets_the_key_lease_floor_below_every_lease(engine):
    """The check of the floors also finds where the running jobs with a key begin: the
    claims count each key's running jobs from there, `LEASE_MARGIN` below the earliest
    lease, here one that ran out ten minutes ago (its worker stalled, recovery not yet
    there): it still holds its key's unit."""
    store = PgJobStore(engine, key_concurrency={"*": 1})
    try:
        await _backlog(engine, 1, "tenant-1", 0)
        (running,) = await store.claim({"default": 4}, 60)
        assert store.floors.params(["default"], sweep=False)["key_lease_floor"] is None
        async with engine.begin() as conn:
            lease = (
                await conn.execute(
                    sa.update(jobs)
                    .where(jobs.c.id == running.id)
                    .values(locked_until=sa.func.now() - timedelta(minutes=10))
                    .returning(jobs.c.locked_until)
                )
            ).scalar_one()
        await store.check_floors(["default"])
        floor = store.floors.params(["default"], sweep=False)["key_lease_floor"]
        assert floor == micros(lease - LEASE_MARGIN)
        await _backlog(engine, 1, "tenant-1", 0)
        assert await store.claim({"default": 4}, 60) == []  # the key is full
    finally:
        await store.close()


async def test_the_limited_claim_counts_its_keys_use_from_the_key_lease_floor(engine):
    """As the claims do: a job of the key whose lease ran out ten minutes ago still holds
    the key's unit for the limited claim, counted from the floor a check set."""
    store = PgJobStore(
        engine, limits=TypeLimits(concurrency={"sleep": 10}), key_concurrency={"*": 1}
    )
    try:
        await _backlog(engine, 1, "tenant-1", 0)
        (running,) = (await store.claim_limited({"default": 4}, 60)).jobs
        async with engine.begin() as conn:
            await conn.execute(
                sa.update(jobs)
                .where(jobs.c.id == running.id)
                .values(locked_until=sa.func.now() - timedelta(minutes=10))
            )
        await store.check_floors(["default"])
        assert store.floors.key_leases is not None
        await _backlog(engine, 1, "tenant-1", 0)
        assert (await store.claim_limited({"default": 4}, 60)).jobs == []
    finally:
        await store.close()


def test_the_lease_margin_covers_the_longest_a_claim_can_take_to_commit():
    """A claim the check of the floors did not see began before it, at most a statement's,
    a lock's and an idle transaction's time (the server's limits on a worker's session):
    its lease, set from its transaction's start, lies above the key lease floor."""
    assert LEASE_MARGIN.total_seconds() >= 2 * (
        STATEMENT_TIMEOUT + LOCK_TIMEOUT + IDLE_IN_TRANSACTION
    )


async def test_the_limited_claim_keeps_the_workers_key_concurrency(engine):
    """A type under TYPE_CONCURRENCY, its jobs all of one key: the store's limited claim
    takes no more of the key than KEY_CONCURRENCY, counting the handlers of the key that
    outlived their attempts (here one)."""
    store = PgJobStore(
        engine,
        limits=TypeLimits(concurrency={"sleep": 10}),
        key_concurrency={"*": 3},
        key_overruns=lambda: {("default", "tenant-1"): 1},
    )
    try:
        await _backlog(engine, 20, "tenant-1", 30)
        got = await store.claim_limited({"default": 8}, 60)
        assert [job.concurrency_key for job in got.jobs] == ["tenant-1"] * 2
    finally:
        await store.close()


async def test_the_limited_claim_reads_from_the_floors_it_learnt(engine):
    """A worker process's limited claims learn where their type's jobs and leases begin
    (`jobcore.floors.TypeFloors`), and read from there between sweeps."""
    store = PgJobStore(engine, limits=TypeLimits(concurrency={"sleep": 10}))
    try:
        await _backlog(engine, 3, None, 0)
        assert len((await store.claim_limited({"default": 2}, 60)).jobs) == 2
        sent = store.type_floors.params(["default"], sweep=False)
        assert sent["type_floor_queues"] == ["default"] and sent["lease_floors"] != [None]
        store.type_floors.sweeps.done(0.0, 1e9)  # no sweep for a while: from the floors
        await _backlog(engine, 1, None, 3600)  # handed back: below the floor
        assert len((await store.claim_limited({"default": 2}, 60)).jobs) == 1
    finally:
        await store.close()


async def test_a_limited_claim_in_a_queue_with_key_concurrency_reads_from_the_head(engine):
    """A job of a full key is left below what the claim took: read from a floor, it would
    wait for a sweep once its key has room."""
    store = PgJobStore(
        engine, limits=TypeLimits(concurrency={"sleep": 10}), key_concurrency={"*": 1}
    )
    try:
        await _backlog(engine, 2, "tenant-1", 10)
        await _backlog(engine, 1, None, 0)
        first = await store.claim_limited({"default": 3}, 60)
        assert sorted(str(job.concurrency_key) for job in first.jobs) == ["None", "tenant-1"]
        keyed = [job.lease for job in first.jobs if job.concurrency_key is not None]
        assert await store.record(Operation.COMPLETE, keyed) == []
        store.type_floors.sweeps.done(0.0, 1e9)  # no sweep for a while
        again = await store.claim_limited({"default": 3}, 60)
        assert [job.concurrency_key for job in again.jobs] == ["tenant-1"]
    finally:
        await store.close()
