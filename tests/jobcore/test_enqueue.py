"""Transactional enqueue (`jobcore.enqueue`, `jobcore.enqueue_many`) on every kind of
connection it accepts: the job exists, can be claimed and wakes the workers only once the
caller's transaction commits; a rollback leaves nothing; bad input writes nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg
import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from jobcore import compiled, connections, enqueue, enqueue_many, queries, transactional, validation
from jobcore.db import make_engine
from jobcore.errors import IdempotencyConflict, InvalidRequest
from jobcore.registry import handler
from jobcore.rows import Claimed, Lease, Renewed
from jobcore.schema import jobs

KINDS = ["sqlalchemy", "sqlalchemy_async", "asyncpg", "psycopg", "psycopg_async"]


@handler("enqueue_test")
def _enqueue_test(payload: Any, ctx: Any) -> None:
    """A type registered in this process only (the API of these tests never sees it)."""


class Tx:
    """One connection of a kind, used the way its users hold a transaction on it."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        self.url = url
        self.conn: Any = None
        self._engine: Any = None
        self._tx: Any = None

    async def open(self) -> None:
        if self.kind == "sqlalchemy":
            self._engine = sa.create_engine(
                self.url.replace("postgresql://", "postgresql+psycopg://")
            )
            self.conn = self._engine.connect()
        elif self.kind == "sqlalchemy_async":
            self._engine = make_engine(self.url)
            self.conn = await self._engine.connect()
        elif self.kind == "asyncpg":
            self.conn = await asyncpg.connect(self.url)
        elif self.kind == "psycopg":
            self.conn = psycopg.connect(self.url)
        else:
            self.conn = await psycopg.AsyncConnection.connect(self.url)

    async def begin(self) -> None:
        if self.kind == "asyncpg":
            self._tx = self.conn.transaction()
            await self._tx.start()
        # SQLAlchemy and psycopg (not in autocommit mode) begin with the first statement.

    async def enqueue(self, job_type: str, payload: Any = None, **fields: Any) -> UUID:
        found = enqueue(self.conn, job_type, payload, **fields)
        return await found if asyncio.iscoroutine(found) else found  # type: ignore[no-any-return]

    async def enqueue_many(self, items: list[dict[str, Any]]) -> list[UUID]:
        found = enqueue_many(self.conn, items)
        return await found if asyncio.iscoroutine(found) else found  # type: ignore[no-any-return]

    async def execute(self, sql: str) -> None:
        """A statement of the caller's own (its business write) in the same transaction."""
        if self.kind.startswith("sqlalchemy"):
            result = self.conn.execute(sa.text(sql))
            if asyncio.iscoroutine(result):
                await result
        else:
            result = self.conn.execute(sql)
            if asyncio.iscoroutine(result):
                await result

    async def _end(self, commit: bool) -> None:
        if self.kind == "asyncpg":
            await (self._tx.commit() if commit else self._tx.rollback())
            return
        done = self.conn.commit() if commit else self.conn.rollback()
        if asyncio.iscoroutine(done):
            await done

    async def commit(self) -> None:
        await self._end(True)

    async def rollback(self) -> None:
        await self._end(False)

    async def close(self) -> None:
        closed = self.conn.close()
        if asyncio.iscoroutine(closed):
            await closed
        if self._engine is not None:
            disposed = self._engine.dispose()
            if asyncio.iscoroutine(disposed):
                await disposed


@pytest.fixture(params=KINDS)
async def tx(request: pytest.FixtureRequest, database_url: str) -> AsyncIterator[Tx]:
    opened = Tx(request.param, database_url)
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


class Listener:
    """A worker's view: LISTEN on the workers' channel, and the worker's own claim."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.received: list[str] = []

    async def heard(self) -> int:
        """Notifications received so far (a round trip first, so any already sent arrive)."""
        await self.conn.fetchval("SELECT 1")
        return len(self.received)

    async def until_heard(self, within: float = 5.0) -> int:
        deadline = asyncio.get_running_loop().time() + within
        while not await self.heard():
            assert asyncio.get_running_loop().time() < deadline, "no notification arrived"
            await asyncio.sleep(0.02)
        return len(self.received)

    async def claim(self) -> list[Claimed]:
        return await compiled.claim(self.conn, {"default": 10, "mail": 10}, 30.0)


@pytest.fixture
async def listener(database_url: str) -> AsyncIterator[Listener]:
    conn = await asyncpg.connect(database_url)
    found = Listener(conn)
    await conn.add_listener(queries.NOTIFY_CHANNEL, lambda *args: found.received.append(args[2]))
    try:
        yield found
    finally:
        await conn.close()


@pytest.fixture
async def engine_(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(database_url)
    try:
        yield engine
    finally:
        await engine.dispose()


async def _rows(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as conn:
        return list(await conn.execute(sa.select(jobs).order_by(jobs.c.id)))


async def test_a_job_exists_wakes_workers_and_can_start_only_once_its_transaction_commits(
    tx: Tx, listener: Listener, engine_: AsyncEngine
):
    await tx.begin()
    await tx.execute("CREATE TABLE orders (id int)")
    job_id = await tx.enqueue(
        "enqueue_test", {"order": 42}, queue="mail", priority=7, max_attempts=2, timeout="90s"
    )
    assert isinstance(job_id, UUID)
    # Held open: invisible to everyone else, so no worker can claim it; no wake-up yet.
    assert await _rows(engine_) == []
    assert await listener.claim() == []
    assert await listener.heard() == 0

    await tx.commit()
    assert await listener.until_heard() == 1
    (row,) = await _rows(engine_)
    assert (row.id, row.type, row.payload, row.status) == (
        job_id,
        "enqueue_test",
        {"order": 42},
        "pending",
    )
    assert (row.queue, row.priority, row.max_attempts, row.timeout) == ("mail", 7, 2, 90.0)
    (claimed,) = await listener.claim()
    assert claimed.id == job_id


async def test_a_rolled_back_transaction_leaves_no_job_and_no_wake_up(
    tx: Tx, listener: Listener, engine_: AsyncEngine
):
    await tx.begin()
    await tx.enqueue("enqueue_test", {"n": 1})
    await tx.enqueue_many([{"type": "enqueue_test"}, {"type": "sleep", "payload": {}}])
    await tx.rollback()
    assert await _rows(engine_) == []
    assert await listener.heard() == 0
    assert await listener.claim() == []


async def test_enqueue_many_writes_every_job_in_order_with_one_wake_up(
    tx: Tx, listener: Listener, engine_: AsyncEngine
):
    await tx.begin()
    ids = await tx.enqueue_many(
        [
            {"type": "enqueue_test", "payload": {"i": i}, "idempotency_key": f"k{i % 3}"}
            if i % 2
            else {"type": "enqueue_test", "payload": {"i": i}}
            for i in range(6)
        ]
        + [{"type": "enqueue_test", "payload": {"i": 1}, "idempotency_key": "k1"}]
    )
    await tx.commit()
    assert await listener.until_heard() == 1
    rows = {row.id: row for row in await _rows(engine_)}
    assert len(ids) == 7 and len(set(ids)) == 6  # the last item replays the second
    assert ids[-1] == ids[1]
    assert [rows[job_id].payload["i"] for job_id in ids] == [0, 1, 2, 3, 4, 5, 1]
    assert sorted(rows) == sorted(set(ids))


async def test_a_repeated_idempotency_key_returns_the_first_job_and_writes_nothing(
    tx: Tx, listener: Listener, engine_: AsyncEngine
):
    await tx.begin()
    first = await tx.enqueue("enqueue_test", {"a": 1, "b": 2}, idempotency_key="order-7")
    await tx.commit()
    await listener.until_heard()
    await tx.begin()
    # jsonb comparison: key order does not matter; when it is due is not compared.
    again = await tx.enqueue("enqueue_test", {"b": 2, "a": 1}, idempotency_key="order-7", delay=9)
    await tx.commit()
    assert again == first
    assert [row.id for row in await _rows(engine_)] == [first]
    assert await listener.heard() == 1  # the replay created nothing: no wake-up


async def test_a_replay_in_an_open_transaction_does_not_lock_the_running_job(
    tx: Tx, listener: Listener
):
    """The job's worker must be able to renew its lease (and write its outcome) while a
    caller's transaction that replayed the job's key stays open."""
    await tx.begin()
    first = await tx.enqueue("enqueue_test", {"n": 1}, idempotency_key="running-7")
    await tx.commit()
    (running,) = await listener.claim()
    assert running.id == first
    await tx.begin()
    assert await tx.enqueue("enqueue_test", {"n": 1}, idempotency_key="running-7") == first
    try:
        async with asyncio.timeout(5):  # a lock on the row would hold the renewal
            renewed = await compiled.renew(
                listener.conn, [Lease(running.id, running.lease_token)], 30
            )
        assert renewed == Renewed(lost=[], cancel=[], busy=[])
    finally:
        await tx.commit()


async def test_a_key_bound_to_another_request_raises_and_the_batch_writes_nothing(
    tx: Tx, engine_: AsyncEngine
):
    await tx.begin()
    bound = await tx.enqueue("enqueue_test", {"v": 1}, idempotency_key="bound")
    await tx.commit()
    await tx.begin()
    with pytest.raises(IdempotencyConflict) as raised:
        await tx.enqueue_many(
            [
                {"type": "enqueue_test", "payload": {"new": 1}},
                {"type": "enqueue_test", "payload": {"v": 2}, "idempotency_key": "bound"},
            ]
        )
    assert raised.value.key == "bound"
    # The caller's transaction is still usable, and holds none of the batch.
    await tx.execute("SELECT 1")
    await tx.commit()
    assert [row.id for row in await _rows(engine_)] == [bound]


async def test_a_periodic_schedules_key_is_refused(tx: Tx, engine_: AsyncEngine):
    await tx.begin()
    with pytest.raises(InvalidRequest, match="reserved"):
        await tx.enqueue(
            "enqueue_test", {}, idempotency_key="periodic:nightly:2099-01-01T00:00:00Z"
        )
    await tx.commit()
    assert await _rows(engine_) == []


async def test_invalid_input_raises_the_apis_message_and_writes_nothing(
    tx: Tx, engine_: AsyncEngine
):
    await tx.begin()
    with pytest.raises(InvalidRequest, match=r"unknown job type 'nope': .* JOB_TYPES"):
        await tx.enqueue("nope", {})
    with pytest.raises(ValueError, match=r"field 'priority' must be an integer from -100 to 100"):
        await tx.enqueue("enqueue_test", priority=101)
    with pytest.raises(
        ValueError, match=r"2 invalid item\(s\), nothing was written: \[1\] .*\[2\] "
    ):
        await tx.enqueue_many(
            [
                {"type": "enqueue_test"},
                {"type": "enqueue_test", "payload": {"s": "a\x00b"}},
                {"type": "enqueue_test", "colour": "red"},
            ]
        )
    await tx.execute("SELECT 1")  # nothing reached the database: the transaction is fine
    await tx.commit()
    assert await _rows(engine_) == []


async def test_a_concurrency_key_is_stored_and_a_bad_one_is_refused_writing_nothing(
    tx: Tx, engine_: AsyncEngine
):
    await tx.begin()
    keyed = await tx.enqueue("enqueue_test", {}, concurrency_key="tenant-7")
    plain = await tx.enqueue("enqueue_test", {})
    for bad, message in [
        (None, "must be a string"),
        (7, "must be a string"),
        ("", "must be 1 to 255 characters, got 0"),
        ("k" * 256, "must be 1 to 255 characters, got 256"),
        ("a\x00b", r"must not contain control characters \(found U\+0000"),
        ("a\nb", r"must not contain control characters \(found U\+000A"),
        ("a\u2029", r"must not contain control characters \(found U\+2029"),
        ("a\ud800", "unpaired surrogate"),
    ]:
        with pytest.raises(InvalidRequest, match=f"field 'concurrency_key' .*{message}"):
            await tx.enqueue("enqueue_test", {}, concurrency_key=bad)
        with pytest.raises(
            InvalidRequest, match=r"1 invalid item\(s\), nothing was written: \[1\]"
        ):
            await tx.enqueue_many(
                [{"type": "enqueue_test"}, {"type": "enqueue_test", "concurrency_key": bad}]
            )
    await tx.execute("SELECT 1")  # nothing reached the database: the transaction is fine
    await tx.commit()
    rows = {row.id: row for row in await _rows(engine_)}
    assert sorted(rows) == sorted([keyed, plain])
    assert (rows[keyed].concurrency_key, rows[plain].concurrency_key) == ("tenant-7", None)


async def test_a_replay_compares_the_concurrency_key(tx: Tx, engine_: AsyncEngine):
    await tx.begin()
    first = await tx.enqueue("enqueue_test", {}, idempotency_key="o-1", concurrency_key="a")
    none = await tx.enqueue("enqueue_test", {}, idempotency_key="o-2")
    await tx.commit()
    await tx.begin()
    assert await tx.enqueue("enqueue_test", {}, idempotency_key="o-1", concurrency_key="a") == first
    assert await tx.enqueue("enqueue_test", {}, idempotency_key="o-2") == none
    await tx.commit()
    for key, other in [
        ("o-1", {"concurrency_key": "b"}),
        ("o-1", {}),
        ("o-2", {"concurrency_key": "a"}),
    ]:
        await tx.begin()
        with pytest.raises(IdempotencyConflict) as raised:
            await tx.enqueue("enqueue_test", {}, idempotency_key=key, **other)
        assert raised.value.key == key
        await tx.commit()
    # Repeated inside one batch: the first item decides.
    await tx.begin()
    with pytest.raises(IdempotencyConflict):
        await tx.enqueue_many(
            [
                {"type": "enqueue_test", "idempotency_key": "o-3", "concurrency_key": "a"},
                {"type": "enqueue_test", "idempotency_key": "o-3", "concurrency_key": "b"},
            ]
        )
    await tx.commit()
    assert {row.id: row.concurrency_key for row in await _rows(engine_)} == {first: "a", none: None}


def test_bad_items_are_refused_with_the_same_message_as_the_api():
    item = {
        "type": "enqueue_test",
        "queue": "Mail",
        "delay": "1s",
        "run_at": "2030-01-01T00:00:00Z",
    }
    with pytest.raises(InvalidRequest) as api:
        validation.new_items([item], known_types=["enqueue_test"], default_max_attempts=5)
    with pytest.raises(InvalidRequest) as ours:
        enqueue_many(_NoDatabase(), [item])  # refused before any statement
    assert str(ours.value) == str(api.value)


class _NoDatabase:
    """Passes for a SQLAlchemy connection by name; any statement fails the test."""

    def execute(self, *args: Any) -> Any:
        raise AssertionError("a statement was sent")


_NoDatabase.__module__ = "sqlalchemy.engine.base"
_NoDatabase.__qualname__ = "Connection"


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"when": datetime(2030, 1, 1)}, "field 'payload' is not JSON"),
        ({"x": float("nan")}, "field 'payload' is not JSON"),
        ({"a\x00": 1}, r"strings must not contain \\u0000"),
        ((("x\x00",),), r"strings must not contain \\u0000 \(found at \$\[0\]\[0\]\)"),
        (_nested(validation.MAX_DEPTH + 1), "nested deeper than 100 levels"),
        ({"é": ["ü", "\ud800"]}, r"string at \$\.é\[1\] holds an unpaired surrogate"),
        ({"k": ["x", "ascii\x00é"]}, r"strings must not contain \\u0000 \(found at \$\.k\[1\]\)"),
        ({"[{" * 60: _nested(validation.MAX_DEPTH)}, "nested deeper than 100 levels"),
    ],
)
def test_payloads_jsonb_cannot_store_are_refused_before_any_statement(payload: Any, message: str):
    with pytest.raises(ValueError, match=message):
        enqueue(_NoDatabase(), "enqueue_test", payload)


@pytest.mark.parametrize(
    "payload",
    [
        _nested(validation.MAX_DEPTH - 1),  # 100 levels with the job's own object
        {"text": "[{" * 200},  # brackets in strings are not nesting
        {"é": "ü", "\\u0000": "a backslash, not U+0000"},
    ],
)
def test_payloads_jsonb_can_store_are_taken_whatever_their_text_looks_like(payload: Any):
    (job,) = transactional._plan([{"type": "enqueue_test", "payload": payload}]).rows
    assert job.payload == payload


@pytest.mark.parametrize(
    ("payload", "text"),
    [
        (
            {"n": 1, "s": "é", "f": 1.5, "b": [True, None]},
            '{"n":1,"s":"é","f":1.5,"b":[true,null]}',
        ),
        ({"big": 2**70}, '{"big":1180591620717411303424}'),  # beyond orjson's 64 bits
        ({1: "a", None: "b"}, '{"1":"a","null":"b"}'),  # keys as json.dumps writes them
        ({"x": {"s": "\ud800"}}, None),  # a lone surrogate: refused (by check_storable)
        ({"x": float("inf")}, None),  # orjson would write null
        ({"x": [float("nan")]}, None),
    ],
)
def test_a_payload_is_encoded_or_refused_as_the_standard_encoder_would(
    payload: Any, text: str | None
):
    if text is None:
        with pytest.raises(ValueError):
            transactional._plan([{"type": "enqueue_test", "payload": payload}])
        return
    (encoded,) = transactional._plan([{"type": "enqueue_test", "payload": payload}]).payloads
    assert json.loads(encoded) == json.loads(text)


def test_a_batch_without_idempotency_keys_is_written_by_the_keyless_statement():
    """Nothing in it can conflict, so no arbiter and no RETURNING (docs/performance.md)."""
    seen: list[Any] = []

    class Spy(connections.Runner):
        def fetch(self, statement: Any, values: Any) -> list[Any]:
            seen.append(statement)
            created = {"id": keyed.rows[0].id, "idempotency_key": "k", "created": True}
            return [created] if statement is queries.JOB_SUBMIT_MANY else []

    keyed = transactional._plan([{"type": "enqueue_test", "idempotency_key": "k"}])
    plan = transactional._plan([{"type": "enqueue_test"}, {"type": "sleep"}])
    assert transactional._run(Spy(None), plan) == [new.id for new in plan.rows]
    assert seen == [queries.JOB_SUBMIT_MANY_KEYLESS, queries.JOB_NOTIFY]
    seen.clear()
    assert transactional._run(Spy(None), keyed) == [keyed.rows[0].id]
    assert seen == [queries.JOB_SUBMIT_MANY, queries.JOB_NOTIFY]


async def test_python_times_are_taken_for_run_at_delay_and_timeout(
    database_url: str, engine_: AsyncEngine
):
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            later = await enqueue(
                conn,
                "enqueue_test",
                run_at=datetime(2100, 1, 1, 1, tzinfo=UTC),
                timeout=timedelta(minutes=2),
            )
            soon = await enqueue(conn, "enqueue_test", delay=timedelta(hours=1))
        with pytest.raises(ValueError, match="aware datetime"):
            await enqueue(conn, "enqueue_test", run_at=datetime(2100, 1, 1))
    finally:
        await conn.close()
    rows = {row.id: row for row in await _rows(engine_)}
    assert rows[later].run_at == datetime(2100, 1, 1, 1, tzinfo=UTC)
    assert rows[later].timeout == 120.0
    assert timedelta(minutes=59) < rows[soon].run_at - rows[soon].created_at <= timedelta(hours=1)


async def test_a_keyless_batch_stores_each_items_own_fields_shared_or_not(
    tx: Tx, engine_: AsyncEngine
):
    """SUBMIT_MANY_KEYLESS sends a value every item shares once: the shared and the per-item
    columns must both land on the right rows."""
    await tx.begin()
    items: list[dict[str, Any]] = [
        {"type": "enqueue_test", "payload": {"i": i}, "queue": "q", "max_attempts": 5}
        for i in range(3)
    ]
    items[1] |= {"type": "sleep", "priority": 7, "timeout": "90s", "delay": 3600}
    items[1] |= {"concurrency_key": "tenant-7"}
    items[2] |= {"run_at": "2100-01-01T00:00:00Z", "priority": -1}
    ids = await tx.enqueue_many(items)
    await tx.commit()
    rows = {row.id: row for row in await _rows(engine_)}
    got = [rows[job_id] for job_id in ids]
    assert [row.type for row in got] == ["enqueue_test", "sleep", "enqueue_test"]
    assert [row.payload for row in got] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert {(row.queue, row.max_attempts, row.idempotency_key) for row in got} == {("q", 5, None)}
    assert [row.priority for row in got] == [0, 7, -1]
    assert [row.timeout for row in got] == [None, 90.0, None]
    assert [row.concurrency_key for row in got] == [None, "tenant-7", None]
    assert got[0].run_at <= got[0].created_at + timedelta(seconds=1)
    assert timedelta(minutes=59) < got[1].run_at - got[1].created_at <= timedelta(hours=1)
    assert got[2].run_at == datetime(2100, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("kind", ["asyncpg", "psycopg"])
async def test_outside_a_transaction_the_job_is_committed_at_once(
    kind: str, database_url: str, listener: Listener
):
    if kind == "asyncpg":
        conn: Any = await asyncpg.connect(database_url)
        job_id = await enqueue(conn, "enqueue_test")
    else:
        conn = psycopg.connect(database_url, autocommit=True)
        job_id = enqueue(conn, "enqueue_test")
    try:
        assert await listener.until_heard() == 1
        assert [job.id for job in await listener.claim()] == [job_id]
    finally:
        closed = conn.close()
        if asyncio.iscoroutine(closed):
            await closed


async def test_a_sqlalchemy_connection_in_autocommit_is_refused_and_writes_nothing(
    database_url: str, engine: AsyncEngine
):
    sync = sa.create_engine(
        database_url.replace("postgresql://", "postgresql+psycopg://"),
        isolation_level="AUTOCOMMIT",
    )
    with sync.connect() as conn, pytest.raises(TypeError, match="AUTOCOMMIT"):
        enqueue(conn, "enqueue_test")
    sync.dispose()
    async with engine.connect() as conn:
        autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
        with pytest.raises(TypeError, match="AUTOCOMMIT"):
            await enqueue(autocommit, "enqueue_test")
    async with engine.connect() as conn:
        assert await conn.scalar(sa.select(sa.func.count()).select_from(jobs)) == 0


def test_an_unknown_connection_is_refused_by_name():
    with pytest.raises(TypeError, match=r"cannot enqueue on a builtins\.object: pass a SQLAlchemy"):
        enqueue(object(), "enqueue_test")


def test_importing_jobcore_stays_cheap_until_enqueue_is_used():
    code = (
        "import sys, jobcore\n"
        "assert 'sqlalchemy' not in sys.modules and 'psycopg' not in sys.modules\n"
        "from jobcore import enqueue, enqueue_many\n"
        "assert 'sqlalchemy' in sys.modules\n"
        "assert 'psycopg' not in sys.modules and 'asyncpg' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _required(statement: Any) -> set[str]:
    from sqlalchemy.dialects.postgresql.asyncpg import dialect

    compiled = statement.compile(dialect=dialect())
    return {name for name, bind in compiled.binds.items() if bind.required}


def test_the_batch_statements_get_exactly_the_parameters_they_take():
    """enqueue builds the statements' parameters itself: a column added to a statement must
    fail here, not in production."""
    keyed = transactional._plan(
        [{"type": "enqueue_test", "payload": {1: ("a",)}, "idempotency_key": "k"}]
    )
    statement, params = transactional._write(keyed)
    assert statement is queries.JOB_SUBMIT_MANY
    assert set(params) == _required(queries.JOB_SUBMIT_MANY)
    assert params["payloads"] == ['{"1":["a"]}']
    keyless = transactional._plan([{"type": "enqueue_test"}])
    statement, params = transactional._write(keyless)
    assert statement is queries.JOB_SUBMIT_MANY_KEYLESS
    assert set(params) == _required(queries.JOB_SUBMIT_MANY_KEYLESS)
    replays = transactional._replays(keyed, [])
    assert replays is not None and replays[0] is queries.JOB_MATCH_REQUESTS
    assert set(replays[1]) == _required(queries.JOB_MATCH_REQUESTS)
