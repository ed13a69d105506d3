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

`held_horizon` is not one of the schedule's kinds: `HeldHorizon` holds the MVCC
horizon back (`tests.chaos.horizon`) in a thread of its own, for a long stretch of the
fault phase while the schedule injects the others, and records it as a fault at its end.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos import audit, horizon
from tests.chaos.checker import LONG_TYPE
from tests.chaos.evidence import HELD_HORIZON, HORIZON_TARGET, Fault, Hold
from tests.chaos.load import LONG_SECONDS, LONG_TIMEOUT, Load
from tests.chaos.system import LEASE_SECONDS, Service, System, wait_until

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
)
# A handler blocking its event loop for longer than the supervisor's stall limit (10 s):
# each attempt costs a process; two attempts, then recovery dead-letters the job.
BLOCK_SECONDS = 30.0
BLOCK_ATTEMPTS = 2
# Row locks on running jobs, held past the worker's own limit on a statement (6 s): the
# writes (and the claims they carry) stuck behind them must be ended by the server, never
# commit behind a worker that gave up on them.
LOCK_SECONDS = 8.0
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
        return Injected("postgres", time.time())

    return restart


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
    """Lock the rows of running jobs (and a probe's) for LOCK_SECONDS on a connection of
    its own, as a long transaction of an operator or another application would."""
    probe = c.load.submit({"type": "chaos-slow", "payload": {"seconds": PROBE_SECONDS}})
    if probe is not None:
        _wait_start(c, probe, 60)
    conn = c.system.cluster.connect()
    try:
        with conn.transaction():
            rows = conn.execute(
                "SELECT id FROM jobs WHERE status = 'processing' FOR UPDATE SKIP LOCKED"
            ).fetchall()
            time.sleep(LOCK_SECONDS)  # the fault's duration, not a wait for a condition
    finally:
        conn.close()
    return Injected("postgres", time.time(), note=f"{len(rows)} running jobs locked")


def _at_rest(c: Chaos, ids: list[str]) -> bool:
    """Whether every job of `ids` finished (retention may have deleted it since)."""
    try:
        ((n,),) = c.system.query(
            "SELECT count(*) FROM jobs WHERE id = ANY(%s::uuid[])"
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
        rows = c.system.query("SELECT lease_token FROM jobs WHERE id = %s", (job_id,))
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
            "  OR (status = 'processing' AND type <> %s)) FROM jobs",
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
