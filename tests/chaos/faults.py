"""The faults of a chaos run, each injected, healed and timed until the system recovers.

One fault at a time, in shuffled cycles of every kind, with a short gap in
between. A fault's recovery time runs from its removal (a restart, a resume,
the proxy passing traffic again; for a kill, the kill itself) until every
service is ready again (workers with all their processes) and a job has
reached a resting state since, or no job is waiting (a long job running is not). A
fault the system does not recover from within RECOVERY_LIMIT is a failure of the run.

`pause` and `pause_long` freeze the holder of a job past its lease: a probe that
returns at once when resumed (a stale writer), or a long job still running (a
holder whose heartbeat must find the lease lost and stop it). Each fault records
the worker processes it stopped, killed or cut off from the database, and when,
for the checker to tell a lease lost to a fault from one lost while its holder
ran undisturbed.

Three faults hold job rows, or cut connections, without touching a process:

- `lock_rows`: an operator's `psql` session runs `BEGIN; SELECT ... FOR UPDATE` on about
  half of the running jobs of each worker process (probes that outlive the lock among
  them) and sits idle in that transaction for LOCK_SECONDS, past the lease and the
  worker's limit on a statement; the other running jobs are bystanders;
- `lock_enqueue`: the same rows locked by the application's own transactional enqueue
  (`jobcore.enqueue`) replaying each job's idempotency key in a transaction it keeps
  open as long;
- `cut_listener`: the workers' LISTEN connections terminated (`pg_terminate_backend`)
  while cancels of running probes are in flight, some sent just before, some during.

A locked row disturbs only its own job's holder (`evidence.Fault.locked_jobs`): a
bystander that loses its lease meanwhile lost it undisturbed, a violation. A cut listener
disturbs no lease, so the cancels must stop their jobs within the usual bound.

`failover` needs a replicated system (`tests.chaos.system`): the primary's whole cluster is
killed (SIGKILL, no shutdown) and its synchronous standby promoted; the services, whose URL
names both servers, must find it on their own. Once they have recovered, the old primary
is rewound (pg_rewind) into the new one's synchronous standby, so the next failover goes
the other way.

`held_horizon` is not one of the schedule's kinds: `HeldHorizon` holds the MVCC
horizon back (`tests.chaos.horizon`) in a thread of its own, for a long stretch of the
fault phase while the schedule injects the others, and records it as a fault at its end.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

import tests.chaos.handlers  # noqa: F401 - registers the job types transactional enqueue checks
from jobcore import enqueue
from tests.chaos import audit, horizon
from tests.chaos.checker import CUT_MODE, LONG_TYPE
from tests.chaos.evidence import (
    HELD_HORIZON,
    HORIZON_TARGET,
    LISTENERS,
    ROWS,
    Fault,
    Hold,
)
from tests.chaos.load import LONG_SECONDS, LONG_TIMEOUT, Load
from tests.chaos.system import LEASE_SECONDS, Service, System, wait_until
from tests.infra.replication import (
    kill_cluster,
    make_synchronous,
    promote,
    rejoin,
    wait_synchronous,
)

RECOVERY_LIMIT = 90.0
# A graceful stop takes SHUTDOWN_TIMEOUT, a release write, and a margin for a loaded machine.
STOP_LIMIT = 40.0
PROBE_SECONDS = 1.5
# The paused probe blocks its event loop this long (tests.chaos.handlers).
STALE_PROBE_SECONDS = 1.0

KINDS = (
    "kill_child",
    "kill_worker",
    "term_worker",
    "kill_api",
    "pg_restart_fast",
    "pg_restart_immediate",
    "terminate_backends",
    "proxy_latency",
    "proxy_blackhole",
    "proxy_refuse",
    "pause",
    "pause_long",
    "block_loop",
    "hang_threads",
    "lock_rows",
    "lock_enqueue",
    "cut_listener",
    "failover",
)
# A handler blocking its event loop for longer than the supervisor's stall limit (10 s):
# each attempt costs a process; two attempts, then recovery dead-letters the job.
BLOCK_SECONDS = 30.0
BLOCK_ATTEMPTS = 2
# Row locks on running jobs, held past the worker's own limit on a statement (6 s): the
# writes (and the claims they carry) stuck behind them must be ended by the server, never
# commit behind a worker that gave up on them; and the leases of the jobs whose rows are
# not locked must not suffer.
LOCK_SECONDS = 8.0
# Probes running through the lock (a plain sleep under a timeout of its own), so that each
# worker process likely holds some locked and some free jobs at once.
LOCK_PROBES = 6
LOCK_PROBE = {
    "type": "chaos-slow",
    "payload": {"seconds": LOCK_SECONDS + 4},
    "timeout": LONG_TIMEOUT,
}
LOCK_SHARE = 0.5  # of each process's running jobs, the share whose rows are locked
# The application_name of the locking sessions (terminate_backends does not kill them).
PSQL_NAME = "chaos-lock-psql"
ENQUEUE_NAME = "chaos-lock-enqueue"
# The workers' LISTEN connections (jobqueue_worker.listener), and the probes whose cancels
# are asked around the cut: seconds from the cut, just before it and while they are gone.
LISTEN_NAME = "jobqueue-worker-listen"
CUT_PROBE = {"type": "chaos-slow", "payload": {"seconds": 12.0}, "timeout": LONG_TIMEOUT}
CUT_OFFSETS = (-0.2, 0.0, 0.3, 1.0, 2.0)
RECONNECT_LIMIT = 30.0
# Plain handlers sleeping past JOB_TIMEOUT, more of them than a process has slots.
HANG_SECONDS = 6.0
HANG_JOBS = 12
HANG_ATTEMPTS = 2


class Tail:
    """Reads the execution records appended since the last call, across every file, and
    keeps track of the executions that have started and not ended."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._offsets: dict[Path, int] = {}
        self.running: dict[tuple[str, int], int] = {}  # (job_id, lease_token) -> pid
        self.ended: dict[tuple[str, int], dict[str, Any]] = {}  # the end records seen

    def poll(self) -> list[dict[str, Any]]:
        records = []
        for path in self.directory.glob("*.jsonl"):
            offset = self._offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            self._offsets[path] = offset + len(complete)
            records.extend(json.loads(line) for line in complete.splitlines() if line.strip())
        for r in records:
            key = (r["job_id"], r["lease_token"])
            if r["event"] == "start":
                self.running[key] = r["pid"]
            else:
                self.running.pop(key, None)
                self.ended[key] = r
        return records

    def busy(self, pids: list[int]) -> list[int]:
        """Those of `pids` running a job right now."""
        self.poll()
        running = set(self.running.values())
        return [pid for pid in pids if pid in running]


@dataclass
class Chaos:
    system: System
    load: Load
    rng: random.Random
    faults: list[Fault] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    log: Callable[[str], None] = print

    def __post_init__(self) -> None:
        self.tail = Tail(self.system.exec_dir)


@dataclass
class Injected:
    target: str
    healed_at: float | None = None
    killed_pids: tuple[int, ...] = ()
    paused_pids: tuple[int, ...] = ()
    note: str = ""
    stopped_at: float | None = None  # when killed_pids or paused_pids were signalled
    partitioned_pids: tuple[int, ...] = ()  # worker processes cut off from the database
    locked_jobs: tuple[str, ...] = ()  # jobs whose rows were locked (target ROWS)
    detail: Mapping[str, Any] = field(default_factory=dict)
    # Run once the system recovered, outside the time measured (`failover`'s rejoin): what
    # it measured, merged into the fault's detail.
    then: Callable[[], Mapping[str, Any]] | None = None


# --- injectors ----------------------------------------------------------------------


def _busy_pid(c: Chaos) -> int | None:
    """A worker process in the middle of a job, the crash worth testing; if none is busy,
    one that has just started a slow job submitted for the purpose."""
    pids = [pid for w in c.system.workers for pid in w.current.working_children()]
    busy = c.tail.busy(pids)
    if busy:
        return c.rng.choice(busy)
    job_id = c.load.submit({"type": "chaos-slow", "payload": {"seconds": PROBE_SECONDS}})
    started = _wait_start(c, job_id, 60) if job_id is not None else None
    return started[0] if started is not None and started[0] in pids else None


def _owner_of(c: Chaos, pid: int | None) -> Service:
    owners = [w for w in c.system.workers if pid in w.current.children()]
    return owners[0] if owners else c.rng.choice(c.system.workers)


def kill_child(c: Chaos) -> Injected:
    children = {pid: w for w in c.system.workers for pid in w.current.children()}
    pid = _busy_pid(c) or c.rng.choice(list(children))
    os.kill(pid, signal.SIGKILL)
    return Injected(
        children[pid].name, killed_pids=(pid,), note=f"pid {pid}", stopped_at=time.time()
    )


def kill_worker(c: Chaos) -> Injected:
    service = _owner_of(c, _busy_pid(c))
    pids = (service.current.pid, *service.current.children())
    killed_at = time.time()
    service.current.kill_group()
    c.system.launch(service)
    return Injected(service.name, time.time(), killed_pids=pids, stopped_at=killed_at)


def term_worker(c: Chaos) -> Injected:
    service = _owner_of(c, _busy_pid(c))
    process = service.current
    process.signal(signal.SIGTERM)
    code = process.wait(STOP_LIMIT)
    if code is None:
        process.kill_group()
        c.problems.append(f"{service.name} did not stop within {STOP_LIMIT}s of SIGTERM")
    elif code != 0:
        c.problems.append(f"{service.name} exited {code} after SIGTERM (expected 0)")
    c.system.launch(service)
    return Injected(service.name, time.time(), note=f"exit status {code}")


def kill_api(c: Chaos) -> Injected:
    service = c.rng.choice(c.system.apis)
    service.current.kill_group()
    c.system.launch(service)
    return Injected(service.name, time.time())


def _pg_restart(mode: str) -> Callable[[Chaos], Injected]:
    def restart(c: Chaos) -> Injected:
        c.system.cluster.restart(mode)
        name = c.system.standby_name
        if name is not None:
            # Every commit waits for the synchronous standby, which reconnects only after
            # its retry interval: the database takes writes again once it streams.
            wait_synchronous(c.system.cluster, name, RECOVERY_LIMIT)
        return Injected("postgres", time.time())

    return restart


def failover(c: Chaos) -> Injected:
    system = c.system
    old, new = system.cluster, system.standby
    if new is None:
        raise RuntimeError("failover needs a replicated system (a standby)")
    killed_at = time.time()
    kill_cluster(old)
    promote(new)
    system.cluster, system.standby, system.standby_name = new, old, None
    system.failovers += 1
    healed_at = time.time()
    name = f"node{old.port}"

    def rejoin_old() -> Mapping[str, Any]:
        began = time.monotonic()
        rejoin(old, new, name)
        make_synchronous(new, name)
        system.standby_name = name
        return {"rejoined_seconds": round(time.monotonic() - began, 2)}

    return Injected(
        "postgres",
        healed_at,
        note=f"{old.port} killed, {new.port} promoted",
        stopped_at=killed_at,
        detail={"promoted_seconds": round(healed_at - killed_at, 2)},
        then=rejoin_old,
    )


def terminate_backends(c: Chaos) -> Injected:
    (count,) = c.system.query(
        "SELECT count(*) FROM ("
        " SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE (application_name LIKE 'jobqueue%%' OR application_name LIKE %s)"
        " AND random() < 0.6) t",
        (horizon.SESSION_PREFIX + "%",),
    )[0]
    return Injected("postgres", note=f"{count} connections")


def _with_proxy(
    hold: float, apply: Callable[[Service, random.Random], str]
) -> Callable[[Chaos], Injected]:
    def inject(c: Chaos) -> Injected:
        service = c.rng.choice(c.system.services)
        pids = (service.current.pid, *service.current.children()) if service.is_worker else ()
        note = apply(service, c.rng)
        time.sleep(hold)  # the fault's duration, not a wait for a condition
        service.proxy.pass_through()
        return Injected(service.name, time.time(), note=note, partitioned_pids=pids)

    return inject


def _latency(service: Service, rng: random.Random) -> str:
    seconds = round(rng.uniform(0.1, 0.4), 2)
    service.proxy.add_latency(seconds)
    return f"{seconds}s"


def _blackhole(service: Service, rng: random.Random) -> str:
    service.proxy.blackhole()
    return "half-open"


def _refuse(service: Service, rng: random.Random) -> str:
    service.proxy.refuse()
    service.proxy.cut()
    return "refused and reset"


def pause(c: Chaos) -> Injected:
    """SIGSTOP the worker process running a probe job until another worker has re-claimed it,
    then SIGCONT it: the probe returns at once and the resumed process is a stale writer
    whose outcome must be rejected."""
    probe = {"type": "chaos-probe", "payload": {"seconds": STALE_PROBE_SECONDS}}
    return _pause(c, "pause", probe)


def pause_long(c: Chaos) -> Injected:
    """SIGSTOP the worker process running a long job until another worker has re-claimed it,
    then SIGCONT it: the handler still runs, and the resumed holder's heartbeat must find
    its lease lost and stop it, writing nothing."""
    job = {
        "type": "chaos-long",
        "payload": {"seconds": LONG_SECONDS[1], "later_seconds": PROBE_SECONDS},
        "timeout": LONG_TIMEOUT,
    }
    return _pause(c, "pause_long", job)


def _pause(c: Chaos, kind: str, body: dict[str, Any]) -> Injected:
    for _ in range(3):
        job_id = c.load.submit(body)
        if job_id is None:
            continue
        started = _wait_start(c, job_id, 60)
        if started is None:
            continue
        pid, token = started
        os.kill(pid, signal.SIGSTOP)
        paused_at = time.time()
        wait_until(lambda pid=pid: _stopped(pid), 5, 0.01)
        if _ended(c, job_id, token) is not None:
            os.kill(pid, signal.SIGCONT)  # too late: the job finished before the pause
            continue
        reclaimed = wait_until(
            lambda job_id=job_id, token=token: _token_after(c, job_id, token),
            LEASE_SECONDS + 60,
            0.02,
        )
        os.kill(pid, signal.SIGCONT)
        resumed_at = time.time()
        note = f"pid {pid}, job {job_id} lease {token}"
        if reclaimed is None:
            note += ": never re-claimed"
            c.problems.append(f"{kind}: job {job_id} was not re-claimed after its lease expired")
        # The checker judges how soon the resumed holder stopped; the note tells.
        wait_until(
            lambda job_id=job_id, token=token: _ended(c, job_id, token) is not None,
            LEASE_SECONDS + 10,
            0.02,
        )
        end = _ended(c, job_id, token)
        if end is not None:
            note += f", ended {end['outcome']} {end['t'] - resumed_at:+.2f}s after resume"
        return Injected(
            _owner_of(c, pid).name, resumed_at, paused_pids=(pid,), note=note, stopped_at=paused_at
        )
    c.problems.append(f"{kind}: no job could be paused mid-run")
    return Injected("none", time.time(), note="missed")


def _ended(c: Chaos, job_id: str, token: int) -> dict[str, Any] | None:
    """The end record of the execution of `job_id` under lease `token`, once there is one."""
    c.tail.poll()
    return c.tail.ended.get((job_id, token))


def block_loop(c: Chaos) -> Injected:
    """A job whose `async def` handler blocks the event loop: the supervisor must kill and
    replace each process it stalls, and recovery must dead-letter it after its attempts."""
    job_id = c.load.submit(
        {
            "type": "chaos-block-loop",
            "payload": {"seconds": BLOCK_SECONDS},
            "max_attempts": BLOCK_ATTEMPTS,
        }
    )
    if job_id is None:
        c.problems.append("block_loop: the blocking job was not acknowledged")
        return Injected("none", time.time(), note="not submitted")
    limit = BLOCK_ATTEMPTS * (LEASE_SECONDS + 30) + 30
    rested = wait_until(lambda: _at_rest(c, [job_id]), limit, 0.2)
    pids = tuple(sorted({int(r["pid"]) for r in _records_of(c, job_id) if r["event"] == "start"}))
    note = f"job {job_id}, stalled pids {', '.join(map(str, pids))}"
    if rested is None:
        c.problems.append(f"block_loop: job {job_id} was not at rest within {limit:g}s")
        note += ": never at rest"
    target = _owner_of(c, pids[0]).name if pids else "none"
    # The stalled processes were killed (by their supervisor): their jobs re-run as after a crash.
    return Injected(target, time.time(), killed_pids=pids, note=note)


def hang_threads(c: Chaos) -> Injected:
    """Plain handlers that outlive JOB_TIMEOUT: their threads are abandoned, and the slots
    must go on running the load's jobs meanwhile (never dead-lettered without running)."""
    body = {
        "type": "chaos-hang",
        "payload": {"seconds": HANG_SECONDS},
        "max_attempts": HANG_ATTEMPTS,
    }
    ids = [job_id for _ in range(HANG_JOBS) if (job_id := c.load.submit(body)) is not None]
    limit = HANG_ATTEMPTS * (HANG_SECONDS + 10) + 30
    rested = wait_until(lambda: _at_rest(c, ids), limit, 0.2)
    note = f"{len(ids)} jobs"
    if len(ids) < HANG_JOBS:
        c.problems.append(f"hang_threads: {HANG_JOBS - len(ids)} jobs were not acknowledged")
    if rested is None:
        c.problems.append(f"hang_threads: the hanging jobs were not at rest within {limit:g}s")
        note += ": not at rest"
    return Injected("workers", time.time(), note=note)


def lock_rows(c: Chaos) -> Injected:
    """An operator's psql session locks the rows of about half of the running jobs with a
    plain `SELECT ... FOR UPDATE` and sits idle in its transaction for LOCK_SECONDS."""
    locked, bystanders = _lock_targets(c)
    since = time.time()
    held, how = _psql_lock(c, locked)
    until = time.time()
    return _locked(c, how, since, until, held, bystanders)


def lock_enqueue(c: Chaos) -> Injected:
    """The application's transactional enqueue replays the idempotency key of each of about
    half of the running jobs (the very request each was created by), in a transaction it
    keeps open for LOCK_SECONDS, then commits: a replay that locks the job's row holds it."""
    locked, bystanders = _lock_targets(c)
    rows = c.system.query(
        "SELECT id, type, payload, max_attempts, queue, priority, timeout, idempotency_key,"
        " concurrency_key FROM jobqueue.jobs WHERE id = ANY(%s::uuid[]) AND status = 'processing'"
        " AND idempotency_key IS NOT NULL",
        (locked,),
    )
    since = time.time()
    replayed: list[str] = []
    held: dict[str, Any] = {}
    conn = c.system.cluster.connect(application_name=ENQUEUE_NAME)
    try:
        with conn.transaction():
            for job_id, job_type, payload, attempts, queue, priority, timeout, key, ck in rows:
                fields: dict[str, Any] = {
                    "idempotency_key": key,
                    "max_attempts": attempts,
                    "queue": queue,
                    "priority": priority,
                }
                if timeout is not None:
                    fields["timeout"] = timeout
                if ck is not None:
                    fields["concurrency_key"] = ck
                got = enqueue(conn, job_type, payload, **fields)
                if str(got) != str(job_id):
                    c.problems.append(
                        f"lock_enqueue: replaying job {job_id}'s key {key} returned job {got}"
                    )
                replayed.append(str(job_id))
            held = _rows_locked(c, conn.info.backend_pid, replayed)
            time.sleep(LOCK_SECONDS)  # the open transaction: the fault's duration
    except Exception as exc:
        c.problems.append(f"lock_enqueue: the replays failed: {type(exc).__name__}: {exc}")
    finally:
        conn.close()
    until = time.time()
    held.setdefault("jobs", replayed)
    return _locked(c, "enqueue", since, until, held, bystanders)


def _locked(
    c: Chaos, how: str, since: float, until: float, held: Mapping[str, Any], free: list[str]
) -> Injected:
    """The fault's record: the jobs whose rows were seen locked (all those asked for, when
    the locks could not be read) disturbed their holders from `since` to `until`."""
    asked = tuple(sorted(held.get("jobs", ())))
    seen = held.get("seen")
    jobs = asked if seen is None else tuple(sorted(seen))
    found = "" if seen is None else f" ({len(seen)} seen locked)"
    return Injected(
        ROWS,
        until,
        note=f"{how}: {len(asked)} running jobs' rows taken{found}, {len(free)} free",
        stopped_at=since,
        locked_jobs=jobs,
        detail={
            "via": how,
            "asked": len(asked),
            "seen_locked": None if seen is None else len(seen),
            "bystanders": len(free),
        },
    )


def _lock_targets(c: Chaos) -> tuple[list[str], list[str]]:
    """Probes that outlive the lock, submitted and seen running; then the running jobs (as
    the database and the execution records agree), split per worker process: about
    LOCK_SHARE of each process's to lock, at least one, and at least one left free where
    it runs two or more. Returns (to lock, left free)."""
    probes = [j for _ in range(LOCK_PROBES) if (j := c.load.submit(LOCK_PROBE)) is not None]
    wait_until(lambda: all(_started(c, j) for j in probes), 30, 0.05)
    held = set()
    with contextlib.suppress(Exception):
        held = {
            (str(job_id), int(token))
            for job_id, token in c.system.query(
                "SELECT id, lease_token FROM jobqueue.jobs WHERE status = 'processing'"
            )
        }
    c.tail.poll()
    by_pid: dict[int, list[str]] = defaultdict(list)
    for key, pid in c.tail.running.items():
        if key in held:
            by_pid[pid].append(key[0])
    locked: list[str] = []
    free: list[str] = []
    for _, ids in sorted(by_pid.items()):
        ids = sorted(ids)
        c.rng.shuffle(ids)
        if len(ids) == 1:
            n = 1 if c.rng.random() < LOCK_SHARE else 0
        else:
            n = min(len(ids) - 1, max(1, round(len(ids) * LOCK_SHARE)))
        locked += ids[:n]
        free += ids[n:]
    return sorted(locked), sorted(free)


def _psql_lock(c: Chaos, ids: list[str]) -> tuple[dict[str, Any], str]:
    """Lock the rows of `ids` still running from a psql session, idle in its transaction
    for LOCK_SECONDS once it holds them; then COMMIT. Without a psql binary, the same
    statements on a psycopg connection."""
    sql = (
        "SELECT id FROM jobqueue.jobs WHERE id = ANY(%s::uuid[]) AND status = 'processing'"
        " ORDER BY id FOR UPDATE"
    )
    psql = _psql(c)
    held: dict[str, Any] = {"jobs": ids}
    if psql is None:
        conn = c.system.cluster.connect(application_name=PSQL_NAME)
        try:
            with conn.transaction():
                rows = conn.execute(sql, (ids,)).fetchall()
                held = _rows_locked(c, conn.info.backend_pid, [str(r[0]) for r in rows])
                time.sleep(LOCK_SECONDS)  # the fault's duration, not a wait for a condition
        finally:
            conn.close()
        return held, "psycopg (no psql)"
    array = "{" + ",".join(ids) + "}"
    url = f"{c.system.cluster.url()}?application_name={PSQL_NAME}"
    proc = subprocess.Popen(
        [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", url],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write("BEGIN;\n" + sql.replace("%s", f"'{array}'") + ";\n")
        proc.stdin.flush()
        # Idle in its transaction: the SELECT returned, every row it found is locked.
        session = wait_until(lambda: _idle_in_transaction(c, PSQL_NAME), 10, 0.02)
        if session is None:
            c.problems.append("lock_rows: the psql session never sat idle in its transaction")
        else:
            pids = c.system.query(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (PSQL_NAME,)
            )
            if pids:
                held = _rows_locked(c, int(pids[0][0]), ids) or held
        time.sleep(LOCK_SECONDS)  # the fault's duration, not a wait for a condition
        proc.stdin.write("COMMIT;\n\\q\n")
        proc.stdin.flush()
    except OSError as exc:  # psql is gone (its session was killed): its exit status says why
        c.problems.append(f"lock_rows: psql stopped reading: {exc}")
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(10)
        errors = proc.stderr.read() if proc.stderr is not None else ""
        if code != 0:
            c.problems.append(f"lock_rows: psql exited {code}: {errors.strip()[:300]}")
    return held, "psql"


def _psql(c: Chaos) -> str | None:
    beside = c.system.cluster.bin / "psql"
    return str(beside) if beside.exists() else shutil.which("psql")


def _idle_in_transaction(c: Chaos, name: str) -> bool:
    try:
        rows = c.system.query(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = %s"
            " AND state = 'idle in transaction'",
            (name,),
        )
    except Exception:
        return False
    return bool(rows)


def _rows_locked(c: Chaos, backend: int, ids: list[str]) -> dict[str, Any]:
    """Which of the jobs `ids` the session of `backend` holds locked (`seen`), read with
    pgrowlocks, which takes no lock on a row; {} if it cannot be read."""
    try:
        rows = c.system.query(
            "SELECT j.id FROM pgrowlocks('jobqueue.jobs') l"
            " JOIN jobqueue.jobs j ON j.ctid = l.locked_row"
            " WHERE %s = ANY(l.pids) AND j.id = ANY(%s::uuid[])",
            (backend, ids),
        )
    except psycopg.Error:
        return {}
    return {"jobs": ids, "seen": sorted(str(r[0]) for r in rows)}


def cut_listener(c: Chaos) -> Injected:
    """Running probes are asked to be cancelled around the moment every worker's LISTEN
    connection is terminated: just before, at once and while the listeners are gone (at
    CUT_OFFSETS from the cut), and one more once they are all back. Their holders must stop
    them as soon as they hear of it, by a renewal or by a listener back."""
    probes = [j for _ in range(len(CUT_OFFSETS) + 1) if (j := c.load.submit(CUT_PROBE))]
    wait_until(lambda: all(_started(c, j) for j in probes), 30, 0.05)
    running = [j for j in probes if _started(c, j)]
    if len(running) < len(probes):
        c.problems.append(f"cut_listener: {len(probes) - len(running)} probes never started")
    around, after = running[: len(CUT_OFFSETS)], running[len(CUT_OFFSETS) :]
    before = _listeners(c)
    lead = max(0.0, -min(CUT_OFFSETS))
    plan = [(j, lead + at) for j, at in zip(around, CUT_OFFSETS, strict=False)]
    asked = c.load.cancel_soon(plan, CUT_MODE)
    time.sleep(lead)  # the first cancel goes out this long before the cut: the plan
    cut_at = time.time()
    ((terminated,),) = c.system.query(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE split_part(application_name, '/', 1) = %s) t",
        (LISTEN_NAME,),
    )
    back_at = wait_until(lambda: _listeners(c, since=cut_at) >= before, RECONNECT_LIMIT, 0.05)
    if after:
        asked_after = c.load.cancel_soon([(j, 0.3) for j in after], CUT_MODE)
    for future in (asked, *([asked_after] if after else [])):
        try:
            future.result(90)
        except Exception as exc:
            c.problems.append(f"cut_listener: the cancels failed: {type(exc).__name__}: {exc}")
    wait_until(lambda: all(_ended_any(c, j) for j in running), LEASE_SECONDS + 20, 0.05)
    back = "never" if back_at is None else f"{back_at - cut_at:.2f}s"
    return Injected(
        LISTENERS,
        back_at if back_at is not None else time.time(),
        note=f"{terminated} of {before} listeners cut, back after {back}; {len(running)} cancels",
        stopped_at=cut_at,
        detail={
            "terminated": int(terminated),
            "listeners_before": before,
            "cut_at": cut_at,
            "back_at": back_at,
            "jobs": running,
            "after_back": after,
        },
    )


def _listeners(c: Chaos, since: float | None = None) -> int:
    """The workers' LISTEN connections (opened after `since`, if given)."""
    try:
        ((n,),) = c.system.query(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE split_part(application_name, '/', 1) = %s"
            " AND (%s::float8 IS NULL OR backend_start > to_timestamp(%s::float8))",
            (LISTEN_NAME, since, since),
        )
    except Exception:
        return 0
    return int(n)


def _started(c: Chaos, job_id: str) -> bool:
    """Whether an execution of `job_id` has recorded its start."""
    c.tail.poll()
    return any(k[0] == job_id for k in c.tail.running) or any(k[0] == job_id for k in c.tail.ended)


def _ended_any(c: Chaos, job_id: str) -> bool:
    """Whether every execution of `job_id` that started has ended."""
    c.tail.poll()
    return not any(k[0] == job_id for k in c.tail.running)


def _at_rest(c: Chaos, ids: list[str]) -> bool:
    """Whether every job of `ids` finished (retention may have deleted it since)."""
    try:
        ((n,),) = c.system.query(
            f"SELECT count(*) FROM {audit.jobs(c.system.query)} WHERE id = ANY(%s::uuid[])"
            " AND status IN ('completed', 'failed', 'dead_letter', 'cancelled')",
            (ids,),
        )
        gone = audit.count(c.system, ids)
    except Exception:
        return False
    return int(n) + gone == len(ids)


def _records_of(c: Chaos, job_id: str) -> list[dict[str, Any]]:
    return [r for r in c.system.execution_records() if r["job_id"] == job_id]


def _wait_start(c: Chaos, job_id: str, timeout: float) -> tuple[int, int] | None:
    found: list[tuple[int, int]] = []

    def seen() -> bool:
        for r in c.tail.poll():
            if r["job_id"] == job_id and r["event"] == "start":
                found.append((int(r["pid"]), int(r["lease_token"])))
        return bool(found)

    return found[0] if wait_until(seen, timeout, 0.01) else None


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2 :].split()[0] in (b"T", b"t")


def _token_after(c: Chaos, job_id: str, token: int) -> bool:
    try:
        rows = c.system.query(
            f"SELECT lease_token FROM {audit.jobs(c.system.query)} WHERE id = %s", (job_id,)
        )
    except Exception:
        return False
    return bool(rows) and int(rows[0][0]) > token


INJECTORS: dict[str, Callable[[Chaos], Injected]] = {
    "kill_child": kill_child,
    "kill_worker": kill_worker,
    "term_worker": term_worker,
    "kill_api": kill_api,
    "pg_restart_fast": _pg_restart("fast"),
    "pg_restart_immediate": _pg_restart("immediate"),
    "terminate_backends": terminate_backends,
    "proxy_latency": _with_proxy(4.0, _latency),
    "proxy_blackhole": _with_proxy(6.0, _blackhole),
    "proxy_refuse": _with_proxy(3.0, _refuse),
    "pause": pause,
    "pause_long": pause_long,
    "block_loop": block_loop,
    "hang_threads": hang_threads,
    "lock_rows": lock_rows,
    "lock_enqueue": lock_enqueue,
    "cut_listener": cut_listener,
    "failover": failover,
}


# --- the schedule -----------------------------------------------------------------------


def not_recovered(system: System, since: float) -> str | None:
    """None once every service is ready and a job reached a resting state since `since`
    (or none is waiting); else what is still missing. A long job running is not waiting:
    it may take many seconds to finish on a system that works."""
    down = [s.name for s in system.services if not system.ready(s)]
    if down:
        return "not ready: " + ", ".join(down)
    return stalled(system.query, since)


def stalled(query: Callable[..., list[tuple[Any, ...]]], since: float) -> str | None:
    """None once a job reached a resting state since `since` (or none is waiting), as
    `query` reads the jobs; else what is missing."""
    try:
        ((finished, waiting),) = query(
            "SELECT count(*) FILTER (WHERE status IN ("
            "  'completed', 'failed', 'dead_letter', 'cancelled')"
            "  AND updated_at >= to_timestamp(%s)),"
            " count(*) FILTER (WHERE (status = 'pending' AND run_at <= now())"
            f"  OR (status = 'processing' AND type <> %s)) FROM {audit.jobs(query)}",
            (since, LONG_TYPE),
        )
    except Exception as exc:
        return f"observer query failed: {type(exc).__name__}"
    if finished == 0 and waiting > 0:
        return f"no job finished yet, {waiting} waiting"
    return None


def inject(c: Chaos, kind: str) -> Fault:
    injected_at = time.time()
    done = INJECTORS[kind](c)
    since = done.healed_at or injected_at
    missing: list[str | None] = [None, None]  # now, and the last thing waited for

    def recovered() -> bool:
        missing[0] = not_recovered(c.system, since)
        missing[1] = missing[0] or missing[1]
        return missing[0] is None

    recovered_at = wait_until(recovered, RECOVERY_LIMIT)
    detail = dict(done.detail)
    if done.then is not None:
        try:
            detail.update(done.then())
        except Exception as exc:
            c.problems.append(f"{kind}: after the recovery: {type(exc).__name__}: {exc}")
    fault = Fault(
        kind,
        done.target,
        injected_at,
        done.healed_at,
        recovered_at,
        done.killed_pids,
        done.paused_pids,
        done.note if recovered_at is not None else f"{done.note} ({missing[0]})",
        done.stopped_at,
        done.partitioned_pids,
        locked_jobs=done.locked_jobs,
        detail=detail,
    )
    c.faults.append(fault)
    c.log(fault_line(fault, since, missing[1]))
    return fault


def fault_line(fault: Fault, since: float, waited: str | None = None) -> str:
    """The run's log line of one fault, once the system recovered from it (or never did)."""
    took = "never" if fault.recovered_at is None else f"{fault.recovered_at - since:.2f}s"
    waits = f" (waited for: {waited})" if waited else ""
    return (
        f"fault {fault.kind:<21} {fault.target:<9} {fault.note:<40} recovered after {took}{waits}"
    )


class HeldHorizon:
    """The `held_horizon` fault: the MVCC horizon held back (`tests.chaos.horizon.Holder`)
    in a thread of its own from `offset` seconds into the fault phase for `seconds`, while
    the schedule injects the other faults; then, as after every fault, the wait until a job
    finishes again (on the holder's own monitor connection). Never raises: a failure of the
    holder is a problem of the run, and a hold it never achieved a violation of the checker.
    """

    def __init__(self, c: Chaos, offset: float, seconds: float) -> None:
        self.c = c
        self.phase_started_at = time.time()
        self.start_at = self.phase_started_at + offset
        self.seconds = seconds
        self.fault: Fault | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="held-horizon", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self) -> Fault | None:
        """Wait until the stretch and its recovery are over; the fault it was."""
        left = self.start_at + self.seconds - time.time()
        self._thread.join(max(0.0, left) + RECOVERY_LIMIT + 30)
        if self._thread.is_alive():
            self.c.problems.append("held_horizon: the holder did not let go of the horizon")
            self.stop()
        return self.fault

    def stop(self) -> None:
        """Let go at once (the run is ending early); idempotent."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(30)

    def _run(self) -> None:
        c = self.c
        holder = horizon.Holder(
            lambda name: c.system.cluster.connect(application_name=name),
            stop=self._stop,
            log=c.log,
        )
        hold: Hold | None = None
        recovered_at = None
        try:
            hold = holder.run(self.phase_started_at, self.start_at, self.seconds)
            since = hold.ended_at
            recovered_at = wait_until(
                lambda: self._stop.is_set() or stalled(holder.query, since) is None,
                RECOVERY_LIMIT,
            )
            if self._stop.is_set():
                recovered_at = None
        except Exception as exc:
            c.problems.append(f"held_horizon: the holder failed: {type(exc).__name__}: {exc}")
        finally:
            holder.close()
        if hold is None:
            hold = holder.record.hold(self.start_at, time.time())
        self.fault = Fault(
            HELD_HORIZON,
            HORIZON_TARGET,
            hold.started_at,
            hold.ended_at,
            recovered_at,
            note=hold.note,
            hold=hold,
        )
        c.log(fault_line(self.fault, hold.ended_at))


def run_schedule(c: Chaos, kinds: list[str], until: float, gap: tuple[float, float]) -> None:
    """Cycles of every kind in `kinds`, shuffled; at least one full cycle, then until `until`."""
    first = True
    while first or time.time() < until:
        cycle = list(kinds)
        c.rng.shuffle(cycle)
        for kind in cycle:
            if not first and time.time() >= until:
                return
            inject(c, kind)
            time.sleep(c.rng.uniform(*gap))  # spacing between faults: part of the schedule
        first = False
