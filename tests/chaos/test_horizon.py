"""The held MVCC horizon's arithmetic and its holder against a stand-in server: when it
holds, what it counts as held, and that it reconnects after its sessions are killed."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.chaos.evidence import Hold
from tests.chaos.horizon import (
    IDLE,
    READER,
    SESSION_PREFIX,
    Holder,
    Record,
    overlap,
    qualified,
    stretch,
)

T0 = 1_800_000_000.0


def test_the_stretch_starts_a_fifth_into_the_faults_or_is_their_middle_half() -> None:
    assert stretch(240, 120) == (48, 120)
    assert stretch(120, 60) == (24, 60)
    assert stretch(150, 120) == (30, 120)  # ends exactly with the fault phase
    assert stretch(100, 120) == (25, 50)
    assert stretch(20, 120) == (5, 10)
    assert stretch(240, 0) is None
    assert stretch(0, 120) is None


def test_overlap_counts_only_the_time_both_held() -> None:
    assert overlap([(0, 10)], [(5, 20)]) == 5
    assert overlap([(0, 10), (12, 20)], [(5, 15)]) == 5 + 3
    assert overlap([(0, 10)], [(10, 20)]) == 0
    assert overlap([], [(0, 10)]) == 0


def test_the_table_is_named_as_its_metadata_says_schema_included() -> None:
    metadata = sa.MetaData()
    assert qualified(sa.Table("jobs", metadata)) == '"jobs"'
    assert qualified(sa.Table("jobs", metadata, schema="queue")) == '"queue"."jobs"'
    assert qualified(sa.Table('odd"name', metadata)) == '"odd""name"'


def test_a_session_holds_from_when_it_was_first_seen_until_it_was_last_seen() -> None:
    record = Record(T0, 60)
    assert record.open(IDLE, T0) is False
    assert record.open(READER, T0) is False
    record.seen(IDLE, 700, 5, T0 + 1)
    record.seen(READER, 698, 7, T0 + 1)
    record.seen(IDLE, 700, 50, T0 + 11)
    record.seen(READER, 698, 52, T0 + 11)
    record.lost(IDLE)  # killed somewhere after T0 + 11: held until then, no later
    assert record.open(IDLE, T0 + 13) is True
    record.seen(IDLE, 760, 3, T0 + 14)
    record.seen(IDLE, 760, 9, T0 + 21)
    record.seen(READER, 698, 60, T0 + 21)
    record.dead_tuples += [120, 900, 4000]
    hold = record.hold(T0, T0 + 22)
    assert hold.idle_xids == (700, 760)
    assert hold.reader_xmins == (698,)
    assert hold.reconnects == (T0 + 13,)
    assert hold.held_seconds == 10 + 7
    assert hold.max_age == 60
    assert hold.note == (
        "xid 700…760 (2) + xmin 698 held 17.0s of 60s, 1 reconnects, age 60, "
        "n_dead_tup 120 → max 4000"
    )


def test_a_hold_never_seen_says_so() -> None:
    hold = Record(T0, 60).hold(T0, T0 + 60)
    assert (hold.idle_xids, hold.reader_xmins, hold.held_seconds) == ((), (), 0)
    assert hold.note == (
        "xid none + xmin none held 0.0s of 60s, 0 reconnects, age 0, n_dead_tup never sampled"
    )


# --- the holder against a stand-in for PostgreSQL ----------------------------------------


class Result:
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows


class Server:
    """Backends by pid: application_name, xid, xmin; `faults` run on the Nth look at
    pg_stat_activity, as a restart or terminate_backends would hit the holder."""

    def __init__(self, faults: dict[int, str] | None = None, refuse: bool = False) -> None:
        self.backends: dict[int, list[Any]] = {}
        self.next_pid = 100
        self.next_xid = 1000
        self.looks = 0
        self.faults = faults or {}
        self.refuse = refuse
        self.statements: list[str] = []
        self.dead = 0

    def connect(self, name: str) -> Conn:
        if self.refuse:
            raise psycopg.OperationalError("connection refused")
        self.next_pid += 1
        self.backends[self.next_pid] = [name, None, None]
        return Conn(self, self.next_pid)

    def run(self, pid: int, sql: str, params: Any) -> list[tuple[Any, ...]]:
        self.statements.append(sql)
        backend = self.backends[pid]
        self.dead += 10  # the workers' updates go on
        if sql == "SELECT txid_current()":
            self.next_xid += 1
            backend[1] = self.next_xid
        elif sql.startswith("SELECT count(*) FROM"):
            assert sql == 'SELECT count(*) FROM "jobqueue"."jobs"'
            if backend[2] is None:
                backend[2] = self.next_xid
        elif "pg_stat_activity" in sql:
            self.looks += 1
            fault = self.faults.get(self.looks)
            if fault == "restart":
                self.backends.clear()
                raise psycopg.OperationalError("terminating connection")
            if fault is not None:
                for p, (name, *_) in list(self.backends.items()):
                    if name == SESSION_PREFIX + fault:
                        del self.backends[p]
            return [
                (p, b[0], None if b[1] is None else str(b[1]), None if b[2] is None else str(b[2]),
                 None if b[1] is None else self.next_xid - b[1],
                 None if b[2] is None else self.next_xid - b[2])
                for p, b in self.backends.items() if p in params[0]
            ]  # fmt: skip
        elif "n_dead_tup" in sql:
            assert params == ('"jobqueue"."jobs"',)
            return [(self.dead,)]
        return []

    def holding(self) -> list[str]:
        """The holding sessions still connected (the monitor is not one)."""
        names = {SESSION_PREFIX + IDLE, SESSION_PREFIX + READER}
        return [b[0] for b in self.backends.values() if b[0] in names]


class Info:
    def __init__(self, pid: int) -> None:
        self.backend_pid = pid


class Conn:
    def __init__(self, server: Server, pid: int) -> None:
        self.server, self.info, self.closed = server, Info(pid), False

    def execute(self, sql: str, params: Any = None) -> Result:
        if self.closed or self.info.backend_pid not in self.server.backends:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return Result(self.server.run(self.info.backend_pid, sql, params))

    def close(self) -> None:
        self.closed = True
        self.server.backends.pop(self.info.backend_pid, None)


def hold(server: Server, seconds: float = 0.4) -> tuple[Hold, list[str]]:
    logged: list[str] = []
    holder = Holder(
        server.connect, stop=threading.Event(), log=logged.append, tick=0.01, sample_every=0.05
    )
    try:
        return holder.run(T0, 0, seconds), logged
    finally:
        holder.close()


def test_the_holder_holds_both_ways_and_samples_dead_tuples_then_lets_go() -> None:
    server = Server()
    held, _ = hold(server, seconds=0.6)
    assert len(held.idle_xids) == 1 and len(held.reader_xmins) == 1
    assert held.reconnects == ()
    assert 0.2 < held.held_seconds <= 0.6
    assert held.reads >= 3
    assert len(held.dead_tuples) >= 3 and max(held.dead_tuples) > held.dead_tuples[0]
    assert server.statements[:2] == ["BEGIN", "SELECT txid_current()"]
    assert "BEGIN ISOLATION LEVEL REPEATABLE READ" in server.statements
    assert server.statements.count("ROLLBACK") == 2
    assert server.holding() == []


def test_the_holder_reconnects_after_its_sessions_are_killed_and_holds_again() -> None:
    # terminate_backends hits the idle session on the 5th look, a restart kills everything
    # (the monitor too) on the 15th.
    server = Server(faults={5: IDLE, 15: "restart"})
    held, logged = hold(server, seconds=1.5)
    assert len(held.reconnects) == 3  # the idle session twice, the reader once
    assert len(held.idle_xids) == 3 and len(held.reader_xmins) == 2
    assert held.held_seconds > 0.5
    assert any("the idle session was killed" in line for line in logged)
    assert any("the reader session holds again (reconnected)" in line for line in logged)
    assert server.holding() == []


def test_a_holder_that_cannot_connect_records_that_it_never_held_and_does_not_raise() -> None:
    held, logged = hold(Server(refuse=True), seconds=0.1)
    assert (held.idle_xids, held.reader_xmins, held.held_seconds, held.dead_tuples) == (
        (), (), 0, ()
    )  # fmt: skip
    assert sum("cannot open" in line for line in logged) == 2  # once per session, not per try


@pytest.mark.parametrize("stop_first", [True, False])
def test_a_stopped_holder_lets_go_at_once(stop_first: bool) -> None:
    server = Server()
    stop = threading.Event()
    holder = Holder(server.connect, stop=stop, log=lambda _: None, tick=0.01)
    if stop_first:
        stop.set()
    else:
        threading.Timer(0.05, stop.set).start()
    held = holder.run(T0, 0, 30)
    assert held.ended_at - held.started_at < 5
    assert server.holding() == []
