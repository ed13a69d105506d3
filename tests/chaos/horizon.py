"""The held MVCC horizon of a chaos run: held back for minutes while the other faults go on.

Every claim, renewal and outcome write of a job leaves a dead version of its row, and
VACUUM removes none that a transaction still open might see. Two sessions hold that
horizon back at once, as an operator's forgotten session and a long report would:

- `idle`: `BEGIN; SELECT txid_current();`, then idle in that transaction (its xid holds
  the horizon);
- `reader`: `BEGIN ISOLATION LEVEL REPEATABLE READ`, then `SELECT count(*)` of the jobs
  table (`jobcore.schema.jobs`, wherever its schema puts it) every second, in that one
  transaction (its snapshot's xmin holds the horizon).

A monitor connection of its own reads both sessions in pg_stat_activity every second
(the idle one's backend_xid, the reader's backend_xmin) and, every 10 s, the jobs
table's n_dead_tup. A session that is gone from pg_stat_activity, or whose statement
failed, was killed (a PostgreSQL restart, `terminate_backends`, which hits these two
like the services' connections): it is opened again and holds again until the stretch
ends, each time a reconnect. The holder never raises; what it saw is a `Hold`
(`tests.chaos.evidence`), and a run in which it never held is a violation
(`tests.chaos.checker`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from jobcore.schema import jobs as JOBS
from tests.chaos.evidence import Hold

DEFAULT_SECONDS = 120.0
# The stretch starts this far into the fault phase, if the phase is long enough.
START_FRACTION = 0.2
TICK = 1.0  # the reader's count(*) and the monitor's look at pg_stat_activity
SAMPLE_EVERY = 10.0  # n_dead_tup
# The application_name of the holding sessions; `terminate_backends` kills them too.
SESSION_PREFIX = "chaos-horizon-"
MONITOR_NAME = "chaos-horizon-monitor"
IDLE = "idle"
READER = "reader"
SESSIONS = (IDLE, READER)

# An autocommit connection for an application_name (psycopg's, or a stand-in in tests).
Connect = Callable[[str], Any]
Interval = tuple[float, float]


def stretch(duration: float, seconds: float) -> tuple[float, float] | None:
    """When the horizon is held, as (seconds into the fault phase, seconds held); None if
    off. From START_FRACTION into the phase for `seconds`; if the phase is too short for
    that, its middle half."""
    if seconds <= 0 or duration <= 0:
        return None
    if START_FRACTION * duration + seconds <= duration:
        return START_FRACTION * duration, seconds
    return duration / 4, duration / 2


def overlap(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Seconds covered by both lists of (since, until) intervals, each list disjoint."""
    return sum(max(0.0, min(u1, u2) - max(s1, s2)) for s1, u1 in a for s2, u2 in b)


def qualified(table: sa.Table) -> str:
    """The table's name as SQL: schema-qualified when it has a schema, every part quoted."""
    parts = [table.schema, table.name] if table.schema else [table.name]
    return ".".join('"' + part.replace('"', '""') + '"' for part in parts)


class Record:
    """What the holder saw, as it went; `hold()` is its evidence."""

    def __init__(self, phase_started_at: float, planned_seconds: float) -> None:
        self.phase_started_at = phase_started_at
        self.planned_seconds = planned_seconds
        self.opened: Counter[str] = Counter()
        self.reconnects: list[float] = []
        self.horizons: dict[str, list[int]] = {s: [] for s in SESSIONS}
        self.spans: dict[str, list[Interval]] = {s: [] for s in SESSIONS}
        self.live: dict[str, Interval | None] = dict.fromkeys(SESSIONS)
        self.max_age = 0
        self.dead_tuples: list[int] = []
        self.reads = 0

    def open(self, session: str, at: float) -> bool:
        """`session` is in its transaction; True if that is a reconnect (it was before)."""
        self.opened[session] += 1
        if self.opened[session] > 1:
            self.reconnects.append(at)
            return True
        return False

    def seen(self, session: str, horizon: int, age: int, at: float) -> None:
        """pg_stat_activity showed `session` holding `horizon` (its xid or xmin) at `at`."""
        if horizon not in self.horizons[session]:
            self.horizons[session].append(horizon)
        self.max_age = max(self.max_age, age)
        span = self.live[session]
        self.live[session] = (at, at) if span is None else (span[0], at)

    def lost(self, session: str) -> None:
        """`session` is gone: it held until it was last seen."""
        span = self.live[session]
        if span is not None:
            self.spans[session].append(span)
        self.live[session] = None

    def held(self) -> bool:
        return any(span is not None for span in self.live.values())

    def hold(self, started_at: float, ended_at: float) -> Hold:
        spans = {s: [*self.spans[s], *filter(None, [self.live[s]])] for s in SESSIONS}
        return Hold(
            self.phase_started_at,
            started_at,
            ended_at,
            self.planned_seconds,
            idle_xids=tuple(self.horizons[IDLE]),
            reader_xmins=tuple(self.horizons[READER]),
            reconnects=tuple(self.reconnects),
            held_seconds=round(overlap(spans[IDLE], spans[READER]), 1),
            max_age=self.max_age,
            dead_tuples=tuple(self.dead_tuples),
            reads=self.reads,
        )


class Holder:
    """The two holding sessions and the monitor; `run()` holds for a stretch, then lets go."""

    def __init__(
        self,
        connect: Connect,
        *,
        stop: threading.Event,
        log: Callable[[str], None] = print,
        table: sa.Table = JOBS,
        tick: float = TICK,
        sample_every: float = SAMPLE_EVERY,
    ) -> None:
        self.connect = connect
        self.stop = stop
        self.log = log
        self.table = qualified(table)
        self.tick = tick
        self.sample_every = sample_every
        self.sessions: dict[str, Any] = dict.fromkeys(SESSIONS)
        self.monitor: Any = None
        self.record = Record(time.time(), 0.0)
        self._sampled_at = float("-inf")
        self._failing: set[str] = set()

    def run(self, phase_started_at: float, start_at: float, seconds: float) -> Hold:
        """Hold from `start_at` for `seconds` (or until `stop` is set); what was seen."""
        self.record = Record(phase_started_at, seconds)
        self.stop.wait(max(0.0, start_at - time.time()))
        started_at = time.time()
        until = started_at + seconds
        self.log(f"held_horizon: holding the MVCC horizon for {seconds:g}s")
        while not self.stop.is_set() and time.time() < until:
            began = time.monotonic()
            self._step()
            left = until - time.time()
            self.stop.wait(max(0.0, min(self.tick - (time.monotonic() - began), left)))
        self._look()  # so the spans reach the release
        self._sample(force=True)
        self._release()
        return self.record.hold(started_at, time.time())

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """A statement on the monitor connection, reconnected once if a fault killed it."""
        for attempt in range(2):
            try:
                if self.monitor is None:
                    self.monitor = self.connect(MONITOR_NAME)
                return list(self.monitor.execute(sql, params).fetchall())
            except Exception:
                self._drop_monitor()
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._release()
        self._drop_monitor()

    # --- one second of holding -------------------------------------------------------

    def _step(self) -> None:
        self._look()
        for session in SESSIONS:
            if self.sessions[session] is None:
                self._open(session)
        self._read()
        self._sample()

    def _look(self) -> None:
        """Each open session as pg_stat_activity shows it: holding, or gone (killed)."""
        pids = {s: pid for s, c in self.sessions.items() if c is not None and (pid := _pid(c))}
        if not pids:
            return
        try:
            rows = self.query(
                "SELECT pid, application_name, backend_xid::text, backend_xmin::text,"
                " age(backend_xid), age(backend_xmin) FROM pg_stat_activity"
                " WHERE pid = ANY(%s)",
                (list(pids.values()),),
            )
        except Exception:
            return  # the server is down; the sessions are looked at again once it is back
        now = time.time()
        found = {(int(r[0]), r[1]): r for r in rows}
        for session, pid in pids.items():
            r = found.get((pid, SESSION_PREFIX + session))
            if r is None:
                self._lost(session, "gone from pg_stat_activity")
                continue
            xid, xmin, xid_age, xmin_age = r[2:6]
            horizon, age = (xid, xid_age) if session == IDLE else (xmin, xmin_age)
            if horizon is not None:
                self.record.seen(session, int(horizon), int(age or 0), now)

    def _open(self, session: str) -> None:
        conn = None
        try:
            conn = self.connect(SESSION_PREFIX + session)
            if session == IDLE:
                conn.execute("BEGIN")
                conn.execute("SELECT txid_current()")
            else:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                conn.execute(f"SELECT count(*) FROM {self.table}")
        except Exception as exc:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
            if session not in self._failing:
                self.log(f"held_horizon: cannot open the {session} session yet ({exc!r:.80})")
                self._failing.add(session)
            return
        self._failing.discard(session)
        self.sessions[session] = conn
        if self.record.open(session, time.time()):
            self.log(f"held_horizon: the {session} session holds again (reconnected)")

    def _read(self) -> None:
        conn = self.sessions[READER]
        if conn is None:
            return
        try:
            conn.execute(f"SELECT count(*) FROM {self.table}").fetchall()
            self.record.reads += 1
        except Exception as exc:
            self._lost(READER, f"count(*) failed: {type(exc).__name__}")

    def _sample(self, force: bool = False) -> None:
        """n_dead_tup of the jobs table, every `sample_every` while anything holds."""
        now = time.monotonic()
        if not self.record.held() or (not force and now - self._sampled_at < self.sample_every):
            return
        try:
            rows = self.query(
                "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = to_regclass(%s::text)",
                (self.table,),
            )
        except Exception:
            return
        self._sampled_at = now
        if rows and rows[0][0] is not None:
            self.record.dead_tuples.append(int(rows[0][0]))

    def _lost(self, session: str, why: str) -> None:
        conn, self.sessions[session] = self.sessions[session], None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        self.record.lost(session)
        self.log(f"held_horizon: the {session} session was killed ({why}); reconnecting")

    def _release(self) -> None:
        for session, conn in list(self.sessions.items()):
            if conn is None:
                continue
            with contextlib.suppress(Exception):
                conn.execute("ROLLBACK")
            with contextlib.suppress(Exception):
                conn.close()
            self.record.lost(session)
            self.sessions[session] = None

    def _drop_monitor(self) -> None:
        if self.monitor is not None:
            with contextlib.suppress(Exception):
                self.monitor.close()
        self.monitor = None


def _pid(conn: Any) -> int:
    """The session's backend pid; 0 if its connection cannot tell any more."""
    try:
        return int(conn.info.backend_pid)
    except Exception:
        return 0
