"""What a chaos run left behind, as the invariant checker reads it.

The final `jobs` rows, the rows retention deleted (`tests.chaos.audit`), the
client's acknowledgements and cancel requests, the faults that were injected,
the handlers' execution records (`tests.chaos.handlers`) and the workers' JSON
log lines (`job finished`, `lease lost`, the abandonment of a handler that
outlived its attempt), parsed into the records the checks work on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from jobqueue_worker.heartbeat import RENEWALS_PER_LEASE

# Worker log lines saying an attempt was recorded while its handler ran on (a thread that
# cannot be stopped, a task that ignored its cancellation): the attempt, and the hold of
# its lease, ended then, whenever the handler itself returned.
ABANDONED = ("handler thread abandoned", "handler did not stop when cancelled")
# The worker's line when a holder hears of a cancel request (with `via`).
CANCEL_HEARD = "cancel requested, stopping the attempt"
# The target of a fault that hits the database itself, and so every worker process at once.
DATABASE = "postgres"
# The target of a fault that locks some job rows (`lock_rows`, `lock_enqueue`): it hits every
# process, but only as the holder of one of those jobs (`Fault.locked_jobs`).
ROWS = "rows"
# The target of `cut_listener`: the workers' LISTEN connections. It costs no lease (the
# heartbeats and outcome writes have connections of their own), so it explains no late stop
# of a cancelled job either.
LISTENERS = "listeners"
# The fault that holds back the MVCC horizon beside the others (`tests.chaos.horizon`), and
# its target: no process of the system, so it disturbs no lease.
HELD_HORIZON = "held_horizon"
HORIZON_TARGET = "xmin"


@dataclass(frozen=True)
class JobRow:
    id: str
    type: str
    status: str
    attempts: int
    max_attempts: int
    lease_token: int
    idempotency_key: str | None
    lease_expired: bool = False  # locked_until < now() when the rows were read
    queue: str = "default"
    finished_at: float | None = None  # epoch seconds (the database's clock)


@dataclass(frozen=True)
class Pruned:
    """A job row as retention deleted it, copied by the database in the deleting statement."""

    row: JobRow
    pruned_at: float  # the deleting transaction's now(), epoch seconds
    pruned_by: str  # the deleting session's application_name


@dataclass(frozen=True)
class Ack:
    """A 201 (created) or 200 (replayed) answer to a submission."""

    key: str
    job_id: str
    status_code: int
    due: float | None = None  # epoch seconds no execution of the job may start before
    scheduled: bool = False  # sent with a run_at or delay in the future
    api: str = ""  # the base URL that answered
    answered_at: float | None = None
    queue: str = "default"  # as the client sent it
    concurrency_key: str | None = None


@dataclass(frozen=True)
class ServerError:
    """An answer of 500 or more (503 included) from an API to the client."""

    api: str  # the base URL that answered
    at: float  # epoch seconds of the answer
    status_code: int
    request: str  # e.g. "POST /jobs"


@dataclass(frozen=True)
class CancelRequest:
    """One `POST /jobs/{id}/cancel` the client sent, and what came back (a retry after no
    answer, or a 503, is a request of its own)."""

    job_id: str
    sent_at: float
    answered_at: float | None  # None: no answer came (connection error, timeout)
    status_code: int | None
    attempts: int | None = None  # the job's `attempts` in a 200 or 202 answer
    mode: str = ""  # when the client chose to ask: pending, race or running

    @property
    def answered(self) -> bool:
        """A definitive answer: cancelled (200), asked of the holder (202), refused (409) or
        not found (404). A 503 or no answer leaves it unknown whether the cancel applied."""
        return self.status_code in (200, 202, 404, 409)


@dataclass(frozen=True)
class QueuePause:
    """One pause of a queue (`POST /queues/{queue}/pause`) and its resume, as the operator
    (`tests.chaos.admin`) asked them: sent, and answered 200."""

    queue: str
    paused_sent_at: float
    paused_at: float  # the pause's 200 answer
    resume_sent_at: float  # the resume's first request: the queue may serve again from then
    resumed_at: float | None  # its 200 answer; None: never got one


@dataclass(frozen=True)
class BulkAction:
    """One `POST /jobs/cancel` or `POST /jobs/retry` with a filter, and its 200 answer (a
    request sent again after no answer or a 503 is one of its own: it may have applied)."""

    action: str  # cancel | retry
    filter: Mapping[str, Any]
    sent_at: float
    answered_at: float | None = None
    status_code: int | None = None
    answer: Mapping[str, Any] = field(default_factory=dict)

    def matches(self, job_id: str, job_type: str, queue: str, status: str | None = None) -> bool:
        """Whether the filter selects the job (its status as given, if any)."""
        f = self.filter
        statuses = f.get("status")
        if isinstance(statuses, str):
            statuses = statuses.split(",")
        return (
            ("ids" not in f or job_id in f["ids"])
            and ("type" not in f or f["type"] == job_type)
            and ("queue" not in f or f["queue"] == queue)
            and (statuses is None or status is None or status in statuses)
        )


@dataclass(frozen=True)
class Hold:
    """The MVCC horizon held back while the faults went on (`tests.chaos.horizon`): an idle
    transaction with an xid and a repeatable-read reader, as pg_stat_activity showed them."""

    phase_started_at: float  # when the fault phase began
    started_at: float
    ended_at: float
    planned_seconds: float
    # Seen held in pg_stat_activity, each distinct value once, in order: the idle
    # transaction's backend_xid (it has no snapshot between statements, so no backend_xmin)
    # and the reader's backend_xmin.
    idle_xids: tuple[int, ...] = ()
    reader_xmins: tuple[int, ...] = ()
    # When a session a fault had killed was open and in its transaction again.
    reconnects: tuple[float, ...] = ()
    held_seconds: float = 0.0  # both sessions seen holding at once
    max_age: int = 0  # the most transactions either held back: age(backend_xid / xmin)
    dead_tuples: tuple[int, ...] = ()  # n_dead_tup of the jobs table, sampled while held
    reads: int = 0  # count(*) statements the reader completed

    @property
    def note(self) -> str:
        dead = (
            f"n_dead_tup {self.dead_tuples[0]} → max {max(self.dead_tuples)}"
            if self.dead_tuples
            else "n_dead_tup never sampled"
        )
        return (
            f"xid {_values(self.idle_xids)} + xmin {_values(self.reader_xmins)} held "
            f"{self.held_seconds:.1f}s of {self.planned_seconds:g}s, "
            f"{len(self.reconnects)} reconnects, age {self.max_age}, {dead}"
        )


def _values(values: tuple[int, ...]) -> str:
    if not values:
        return "none"
    if len(values) == 1:
        return str(values[0])
    return f"{values[0]}…{values[-1]} ({len(values)})"


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str
    injected_at: float
    healed_at: float | None = None  # when the fault was removed (restart, resume, pass-through)
    recovered_at: float | None = None  # when the system was serving and completing again
    killed_pids: tuple[int, ...] = ()
    paused_pids: tuple[int, ...] = ()
    note: str = ""
    # When the killed or paused processes were stopped (SIGKILL, SIGSTOP), if known; else
    # the fault counts from `injected_at`.
    stopped_at: float | None = None
    # Worker processes whose path to the database the fault cut or slowed (a proxy fault).
    partitioned_pids: tuple[int, ...] = ()
    hold: Hold | None = None  # a held_horizon fault's record
    # The jobs whose rows a `rows` fault held locked (from `injected_at` to `healed_at`): only
    # their holders were disturbed, and only as their holders.
    locked_jobs: tuple[str, ...] = ()
    # What a fault measured, for the checker and the summary (`cut_listener`: the backends
    # terminated, when the listeners were all back; lock faults: the rows found locked).
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rollout:
    """The rollout phase (`tests.chaos.rollout`): the previous release's services under load
    while the head migrated, the head's started beside them, the old ones stopped."""

    previous: str  # the previous release's commit
    started_at: float
    ended_at: float
    from_revision: str | None  # the schema when the phase began (the previous release's head)
    target_revision: str | None  # the head's newest revision, as its migrations declare it
    to_revision: str | None  # the schema after the head's `alembic upgrade head`
    revisions_applied: tuple[str, ...] = ()
    migration_exit: int | None = None  # None: it never ran
    migration_output: str = ""
    migration_started_at: float | None = None
    migration_ended_at: float | None = None
    old_services: tuple[str, ...] = ()  # names
    old_apis: tuple[str, ...] = ()  # base URLs
    new_apis: tuple[str, ...] = ()
    old_worker_pids: tuple[int, ...] = ()  # every worker process the old services started
    new_ready_at: float | None = None  # when the head's services were all ready
    old_stopped_at: float | None = None  # when the old services were sent SIGTERM
    old_exits: tuple[tuple[str, int | None], ...] = ()  # (name, exit status; None: killed)
    # (service name, time) of each readiness sample that found a serving service unready.
    unready: tuple[tuple[str, float], ...] = ()
    problems: tuple[str, ...] = ()  # what the phase itself could not do


@dataclass(frozen=True)
class Disturbance:
    """A fault as the leases of the processes it hit saw it: from `since` to `until`."""

    pids: frozenset[int] | None  # None: every process (the database itself was hit)
    since: float
    until: float
    # None: every job its processes held; else only these (their rows were locked).
    jobs: frozenset[str] | None = None

    def hits(self, pid: int, start: float, end: float, job_id: str) -> bool:
        """Whether it hit process `pid`, as the holder of `job_id`, at some time between
        `start` and `end`."""
        touched = (self.pids is None or pid in self.pids) and (
            self.jobs is None or job_id in self.jobs
        )
        return touched and self.since <= end and self.until >= start


def disturbances(faults: Iterable[Fault]) -> list[Disturbance]:
    """The faults that could cost a running holder its lease, earliest first. A fault on
    the database hits every process; one that locked job rows hits every process too, but
    only as the holder of one of those jobs: a lease of another job lost meanwhile is not
    explained by it."""
    found = []
    for f in faults:
        pids = frozenset((*f.killed_pids, *f.paused_pids, *f.partitioned_pids))
        rows = f.target == ROWS
        if f.target != DATABASE and not pids and not (rows and f.locked_jobs):
            continue
        since = f.stopped_at if f.stopped_at is not None else f.injected_at
        until = max(since, f.healed_at if f.healed_at is not None else since)
        found.append(
            Disturbance(
                None if f.target in (DATABASE, ROWS) else pids,
                since,
                until,
                frozenset(f.locked_jobs) if rows else None,
            )
        )
    return sorted(found, key=lambda d: d.since)


def disturbed(hits: Iterable[Disturbance], pid: int, start: float, end: float, job_id: str) -> bool:
    return any(d.hits(pid, start, end, job_id) for d in hits)


@dataclass
class Execution:
    """One attempt as its handler saw it, keyed by (job_id, lease_token)."""

    job_id: str
    lease_token: int
    attempt: int
    max_attempts: int
    type: str
    pid: int
    start: float
    end: float | None = None
    outcome: str | None = None  # ok | error | permanent | cancelled; None if it never ended


@dataclass
class Write:
    """What a worker logged about the outcome write of one lease."""

    job_id: str
    lease_token: int
    # From `job finished`: completed | failed | dead_letter | cancelled | retried | released.
    outcome: str | None = None
    finished_at: float | None = None
    lost: bool = False  # a `lease lost` line: the write matched no row
    lost_at: float | None = None
    # A `lease lost` line of a renewal (by the database, or the holder's own clock): the
    # attempt was stopped and nothing written for it.
    renew_lost_at: float | None = None
    abandoned_at: float | None = None  # the worker gave up on the handler, which ran on

    @property
    def applied(self) -> bool:
        return self.outcome is not None and not self.lost


def log_time(text: str) -> float:
    """The `time` field of a service log line (`2026-11-30T12:00:00.123Z`) as epoch seconds."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def executions(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], Execution]:
    """Pair the handlers' start and end records by (job_id, lease_token)."""
    found: dict[tuple[str, int], Execution] = {}
    for r in sorted(records, key=lambda r: (r["event"] != "start", r["t"])):
        key = (r["job_id"], int(r["lease_token"]))
        if r["event"] == "start":
            found[key] = Execution(
                r["job_id"],
                int(r["lease_token"]),
                int(r["attempt"]),
                int(r["max_attempts"]),
                r["type"],
                int(r["pid"]),
                float(r["t"]),
            )
        elif key in found:
            found[key].end, found[key].outcome = float(r["t"]), r["outcome"]
    return found


def writes(entries: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], Write]:
    """The workers' `job finished`, `lease lost` and abandonment lines, by (job_id,
    lease_token)."""
    found: dict[tuple[str, int], Write] = {}
    for e in entries:
        msg = e.get("msg")
        if msg not in ("job finished", "lease lost", *ABANDONED) or "lease_token" not in e:
            continue
        key = (str(e["job_id"]), int(e["lease_token"]))
        w = found.setdefault(key, Write(*key))
        if msg == "job finished":
            w.outcome, w.finished_at = e.get("outcome"), log_time(e["time"])
        elif msg == "lease lost" and e.get("operation") == "renew":
            w.renew_lost_at = log_time(e["time"])
        elif msg == "lease lost":
            w.lost, w.lost_at = True, log_time(e["time"])
        else:
            w.abandoned_at = log_time(e["time"])
    return found


def cancel_paths(entries: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], str]:
    """How each attempt stopped by a cancel heard of it (`via` of the worker's `cancel
    requested, stopping the attempt` line: `notification`, `renewal`, ...), by (job_id,
    lease_token); the first, if it heard twice."""
    found: dict[tuple[str, int], str] = {}
    for e in entries:
        if e.get("msg") == CANCEL_HEARD and "lease_token" in e:
            found.setdefault((str(e["job_id"]), int(e["lease_token"])), str(e.get("via")))
    return found


def attempt_end(e: Execution, logged: Mapping[tuple[str, int], Write]) -> float | None:
    """When execution `e` stopped holding its job: its handler's end, or earlier, when the
    worker abandoned the handler and recorded the attempt without it."""
    w = logged.get((e.job_id, e.lease_token))
    if w is not None and w.abandoned_at is not None:
        return w.abandoned_at if e.end is None else min(e.end, w.abandoned_at)
    return e.end


def pruned_logged(entries: Iterable[Mapping[str, Any]]) -> int:
    """How many jobs the workers say retention deleted (their `jobs pruned` lines)."""
    return sum(int(e.get("total", 0)) for e in entries if e.get("msg") == "jobs pruned")


def lease_valid_until(
    a: Execution, end: float | None, hits: Sequence[Disturbance], lease: float
) -> float:
    """Until when execution `a` surely held a valid lease.

    Its holder renews the lease every lease / RENEWALS_PER_LEASE while it runs, so an
    undisturbed holder keeps it until its attempt ends. A fault that stopped the holder or
    cut it off from the database stops the renewals: the last one may have come up to a
    renewal interval before the fault, so the lease is sure only until then plus the lease.
    """
    valid = end if end is not None else float("inf")
    for d in hits:
        if d.hits(a.pid, a.start, valid, a.job_id):
            valid = min(valid, max(a.start, d.since) + lease - lease / RENEWALS_PER_LEASE)
    return valid
