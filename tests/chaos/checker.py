"""The invariant checker: pure functions over what a chaos run left behind.

Inputs (`tests.chaos.evidence`): the final `jobs` rows and the rows retention
deleted during the run, the client's acknowledgements and cancel requests, the
handlers' execution records (`tests.chaos.handlers`), the workers' JSON log
lines (`job finished`, `lease lost`, `jobs pruned`, and the abandonment of a
handler that outlived its attempt) and the faults that were injected. Output:
the violated invariants (each one sentence) and the summary table.

The guarantees checked:
- every acknowledged job reached a resting state (completed, failed, dead_letter,
  cancelled), in the table or deleted by retention once finished (see
  `tests.chaos.check_retention`): none lost;
- no job ended dead_letter without any recorded execution (it never ran);
- no execution of a job started before the job was due (its `run_at`, or a lower
  bound of it, from the client's acknowledgement);
- no job is left `processing` with an expired lease; no idempotency key made two jobs;
- no outcome was written by a stale lease: a write that applied although a newer
  claim of the job had started before the attempt even ended;
- no two executions of a job overlapped while both held a valid lease. With
  heartbeats a running holder keeps its lease until its attempt ends, however
  long it runs; only a holder a fault disturbed (paused, killed, cut off from the
  database) may lose it, at the earliest LEASE_DURATION less one renewal
  interval after the fault began (its last renewal may have come that much
  before);
- every re-execution is explained: a retry, a shutdown release, a crash (its
  process was killed), a pause past the lease, or a lease lost during a fault
  that disturbed its holder. A lease lost while its holder ran undisturbed is a
  violation, whether or not the job ran again; a fault that locked job rows
  (`lock_rows`, `lock_enqueue`) disturbs only the holders of those jobs, as their
  holders, so a lease of another job lost meanwhile (a bystander of the same process)
  is such a violation;
- a paused holder, once resumed, stops within a renewal interval (and a margin):
  its renewal finds the lease lost, by the database or by its own clock;
- attempts never exceed max_attempts, and a dead-lettered job used all of them;
- a completed (failed) job's final lease belongs to an execution that returned
  (raised PermanentError);
- every answer to a cancel is kept (`tests.chaos.check_cancels`); the cancels asked around
  a cut of the workers' LISTEN connections (`cut_listener`, which disturbs no lease)
  are held to the same bound, and each cut must have terminated listeners, seen them
  all back within RECONNECT_LIMIT and stopped a running job by its cancel;
- the rollout phase, if there was one (`tests.chaos.rollout`): the head's migration
  succeeded and reached its newest revision, no service turned unready while it
  should serve, every old service exited 0 on SIGTERM, no API answered 5xx (503
  included) while the phase went on, and both releases acknowledged and ran jobs;
- no more than the workers' KEY_CONCURRENCY of one (queue, key) ran at once, nor more
  than their TYPE_CONCURRENCY of a type (`tests.chaos.check_keys`);
- queue pauses and bulk cancels and retries (`tests.chaos.check_admin`): no attempt of a
  paused queue starts a second after the pause's answer; no cancelled job starts again;
- a held MVCC horizon (`tests.chaos.horizon`) was held: pg_stat_activity showed its idle
  transaction's xid and its repeatable-read reader's xmin, both at once for a while. It
  touches no process of the system, so it explains no lost lease.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobqueue_worker.heartbeat import RENEWALS_PER_LEASE
from tests.chaos.check_admin import check_bulk, check_pauses, retries_of
from tests.chaos.check_cancels import CANCEL_MARGIN, check_cancels
from tests.chaos.check_keys import check_key_concurrency, check_type_concurrency
from tests.chaos.check_retention import accounted_as_pruned, check_pruned
from tests.chaos.evidence import (
    HELD_HORIZON,
    Ack,
    BulkAction,
    CancelRequest,
    Disturbance,
    Execution,
    Fault,
    JobRow,
    Pruned,
    QueuePause,
    Rollout,
    ServerError,
    Write,
    attempt_end,
    cancel_paths,
    disturbances,
    executions,
    lease_valid_until,
    pruned_logged,
    writes,
)

AT_REST = ("completed", "failed", "dead_letter", "cancelled")
# A handler's start (time.time()) is read after the claim whose now() passed the job's
# run_at: both the same machine's clock, so only their reading order needs a margin.
EARLY_MARGIN = 0.003
# How long after its resume a paused holder may still run, beyond one renewal interval: the
# heartbeat that was due during the pause runs at once, but a loaded machine is slow.
RESUME_MARGIN = 2.0
# From a claim's commit to its handler's first record, on a loaded machine.
CLAIM_TO_START = 0.5
# The job type of the long jobs (tests.chaos.handlers): they outlive the lease many times.
LONG_TYPE = "chaos-long"
# The fault that cuts the workers' LISTEN connections, and the mode of the cancels it asks.
CUT_LISTENER = "cut_listener"
CUT_MODE = "listener_cut"
# How soon every listener a cut terminated must be back (a connection of its own again).
RECONNECT_LIMIT = 30.0
# The faults that lock job rows.
LOCK_KINDS = ("lock_rows", "lock_enqueue")
# The cause of a dead letter's re-run after an operator's bulk retry named it.
BULK_RETRY = "bulk retry"
# What a worker logs when a renewal skipped a job whose row another transaction held.
NOT_RENEWED = "lease not renewed"


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


# --- the checks --------------------------------------------------------------------


def check(
    rows: Sequence[JobRow],
    acks: Sequence[Ack],
    records: Iterable[Mapping[str, Any]],
    log_entries: Iterable[Mapping[str, Any]],
    faults: Sequence[Fault],
    *,
    lease_duration: float,
    tolerance: float = 0.5,
    cancels: Sequence[CancelRequest] = (),
    pruned: Sequence[Pruned] = (),
    retention: Mapping[str, float] | None = None,
    rollout: Rollout | None = None,
    server_errors: Sequence[ServerError] = (),
    key_limit: int = 0,
    type_limits: Mapping[str, int] | None = None,
    pauses: Sequence[QueuePause] = (),
    bulk: Sequence[BulkAction] = (),
) -> Report:
    """Every invariant over one run; see the module docstring. `retention`: the age in
    seconds at which each finished status is deleted (missing or 0: kept). `rollout`: the
    rollout phase's record, if it had one; `server_errors`: every 5xx the client got;
    `key_limit`: the workers' KEY_CONCURRENCY per (queue, key) (0: none); `type_limits`:
    their TYPE_CONCURRENCY per type; `pauses`, `bulk`:
    the operator's queue pauses and bulk actions (`tests.chaos.admin`)."""
    report = Report()
    bad = report.violations
    entries = list(log_entries)
    gone = {p.row.id: p for p in pruned}
    live = {row.id: row for row in rows}
    # A deleted job's row as retention found it stands for its final row.
    finals = [*rows, *(p.row for p in pruned if p.row.id not in live)]
    by_id = {row.id: row for row in finals}
    execs = executions(records)
    logged = writes(entries)
    per_job: dict[str, list[Execution]] = defaultdict(list)
    for e in execs.values():
        per_job[e.job_id].append(e)
    for runs in per_job.values():
        runs.sort(key=lambda e: e.lease_token)
    killed = {pid for f in faults for pid in f.killed_pids}
    paused = {pid for f in faults for pid in f.paused_pids}
    hits = disturbances(faults)

    faults_until = max((f.healed_at or f.injected_at for f in faults), default=None)
    retained = check_pruned(pruned, retention or {}, pruned_logged(entries), bad, faults_until)
    lost = _check_acknowledged(live, gone, acks, bad)
    never_ran = _check_never_ran(by_id, acks, per_job, bad)
    early, lateness = _check_not_early(acks, per_job, bad)
    _check_rows(finals, bad)
    retried = retries_of(bulk)
    stale = _check_stale_writes(per_job, logged, by_id, retried, bad)
    _check_overlaps(per_job, logged, hits, lease_duration, tolerance, bad)
    causes, after_success = _explain_reruns(per_job, logged, killed, paused, hits, retried, bad)
    undisturbed_losses = _check_lost_leases(per_job, logged, hits, bad)
    stopped = _check_resumed_holders(per_job, logged, faults, lease_duration, bad)
    _check_attempts(finals, execs, bad)
    _check_final_lease(finals, execs, bad)
    pruned_at = {job_id: p.pruned_at for job_id, p in gone.items()}
    cancelled = check_cancels(
        cancels, by_id, per_job, logged, hits, killed, pruned_at, lease_duration, bad, bulk
    )
    paused_queues = check_pauses(pauses, by_id, per_job, hits, bad)
    bulk_actions = check_bulk(
        bulk, by_id, per_job, logged, hits, lease_duration, {r.job_id for r in cancels}, bad
    )
    holds = _check_holds(faults, bad)
    keys = (
        check_key_concurrency(acks, per_job, logged, hits, lease_duration, key_limit, bad)
        if key_limit
        else None
    )
    types = check_type_concurrency(per_job, logged, hits, lease_duration, type_limits or {}, bad)
    cuts = _check_listener_cuts(
        faults, cancels, per_job, logged, cancel_paths(entries), lease_duration, bad
    )
    rolled = (
        _check_rollout(rollout, acks, execs, logged, server_errors, bad)
        if rollout is not None
        else None
    )

    acked = {a.job_id for a in acks}
    statuses = Counter(row.status for row in finals if row.id in acked)
    duplicates = {cause: n for cause, n in causes.items() if cause not in ("retry", BULK_RETRY)}
    report.summary = {
        "jobs_submitted": len(acked),
        "completed": statuses["completed"],
        "failed": statuses["failed"],
        "dead_lettered": statuses["dead_letter"],
        "cancelled": statuses["cancelled"],
        "lost": lost,
        "never_ran": never_ran,
        "scheduled_jobs": len({a.job_id for a in acks if a.scheduled}),
        "started_before_due": early,
        "scheduled_lateness_seconds": _spread(lateness),
        "jobs_by_queue": dict(sorted(Counter(row.queue for row in finals).items())),
        "executions": len(execs),
        "retries": causes.get("retry", 0),
        "runs_after_a_bulk_retry": causes.get(BULK_RETRY, 0),
        "duplicate_executions": sum(duplicates.values()),
        "duplicate_causes": dict(sorted(duplicates.items())),
        "duplicates_after_success": after_success,
        "stale_writes_rejected": stale["rejected"],
        "stale_writes_rejected_by_token": stale["by_token"],
        "stale_writes_applied": stale["applied"],
        # A renewal that raced the attempt's own outcome write finds the row finished: no loss.
        "leases_lost_on_renewal": sum(
            w.renew_lost_at is not None and not w.applied for w in logged.values()
        ),
        "renewals_lost_to_their_own_outcome_write": sum(
            w.renew_lost_at is not None and w.applied for w in logged.values()
        ),
        "paused_holders_stopped_by_renewal": stopped,
        "leases_lost_undisturbed": undisturbed_losses,
        "renewals_skipped_for_a_locked_row": sum(e.get("msg") == NOT_RENEWED for e in entries),
        "locked_rows": _locks(faults, per_job, logged),
        "long_jobs": _long_jobs(finals, per_job, logged),
        "claims_without_execution_record": _token_gaps(finals, per_job),
        "cancels": cancelled,
        "keys": keys,
        "type_limits": types,
        "pauses": paused_queues,
        "bulk": bulk_actions,
        "retention": {
            **retained,
            "acknowledged_pruned": sum(j in acked and j not in live for j in gone),
            "ages_seconds": dict(sorted((retention or {}).items())),
        },
        "faults_injected": dict(sorted(Counter(f.kind for f in faults).items())),
        "recovery_seconds": recovery_table(faults),
        "held_horizon": holds,
        "listener_cuts": cuts,
        "rollout": rolled,
        "server_errors": dict(
            sorted(
                Counter(f"{e.status_code} {e.request.split('/')[1]}" for e in server_errors).items()
            )
        ),
        "outcomes_by_type": _outcomes_by_type(finals),
        "violations": len(bad),
    }
    for f in faults:
        if f.recovered_at is None:
            bad.append(f"no recovery after fault {f.kind} on {f.target} {f.note}".strip())
    report.summary["violations"] = len(bad)
    return report


def _check_acknowledged(
    live: Mapping[str, JobRow], gone: Mapping[str, Pruned], acks: Sequence[Ack], bad: list[str]
) -> int:
    """Acknowledged jobs neither at rest in the table nor deleted by retention once
    finished: lost."""
    lost = 0
    ids_by_key: dict[str, set[str]] = defaultdict(set)
    for ack in acks:
        ids_by_key[ack.key].add(ack.job_id)
    for key, ids in ids_by_key.items():
        if len(ids) > 1:
            bad.append(f"idempotency key {key} was acknowledged with {len(ids)} different jobs")
    for job_id in {ack.job_id for ack in acks}:
        row = live.get(job_id)
        if row is None and accounted_as_pruned(job_id, gone):
            continue
        if row is None:
            lost += 1
            bad.append(f"job {job_id} was acknowledged but is not in the database")
        elif row.status not in AT_REST:
            lost += 1
            bad.append(f"job {job_id} was acknowledged but ended {row.status}, not at rest")
    return lost


def _check_never_ran(
    by_id: Mapping[str, JobRow],
    acks: Sequence[Ack],
    per_job: Mapping[str, list[Execution]],
    bad: list[str],
) -> int:
    """Acknowledged jobs that ended dead_letter without a single recorded execution."""
    never = 0
    for job_id in sorted({ack.job_id for ack in acks}):
        row = by_id.get(job_id)
        if row is not None and row.status == "dead_letter" and not per_job.get(job_id):
            never += 1
            bad.append(f"job {job_id} ended dead_letter after {row.attempts} attempts, none ran")
    return never


def _check_not_early(
    acks: Sequence[Ack], per_job: Mapping[str, list[Execution]], bad: list[str]
) -> tuple[int, list[float]]:
    """Executions that started before their job was due (violations), and how late after
    its due time each scheduled job first started."""
    early = 0
    lateness = []
    for ack in acks:
        runs = per_job.get(ack.job_id, [])
        if ack.due is None or not runs:
            continue
        for e in runs:
            if e.start < ack.due - EARLY_MARGIN:
                early += 1
                bad.append(
                    f"job {ack.job_id}: lease {e.lease_token} started "
                    f"{(ack.due - e.start) * 1000:.1f} ms before the job was due"
                )
        if ack.scheduled:
            lateness.append(min(e.start for e in runs) - ack.due)
    return early, lateness


def _spread(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"p50": round(statistics.median(values), 3), "max": round(max(values), 3)}


def _check_rows(rows: Sequence[JobRow], bad: list[str]) -> None:
    keys = Counter(row.idempotency_key for row in rows if row.idempotency_key is not None)
    for key, n in keys.items():
        if n > 1:
            bad.append(f"idempotency key {key} created {n} jobs")
    for row in rows:
        if row.status == "processing" and row.lease_expired:
            bad.append(f"job {row.id} is processing with an expired lease")


def _check_stale_writes(
    per_job: Mapping[str, list[Execution]],
    logged: Mapping[tuple[str, int], Write],
    by_id: Mapping[str, JobRow],
    retried: Mapping[str, list[float]],
    bad: list[str],
) -> dict[str, int]:
    """Applied writes made after a newer claim started are violations; count the rejected ones.

    A rejected write counts `by_token` when, at that moment, the job was held by a
    newer claim that had not written yet: only the lease-token condition could reject it.
    """
    rejected = by_token = applied = 0
    for (job_id, token), w in logged.items():
        newer = [e for e in per_job.get(job_id, []) if e.lease_token > token]
        mine = next((e for e in per_job.get(job_id, []) if e.lease_token == token), None)
        if w.applied:
            end = attempt_end(mine, logged) if mine is not None else None
            ended = end if end is not None else w.finished_at
            assert ended is not None
            early = [e for e in newer if e.start < ended]
            if early:
                applied += 1
                bad.append(
                    f"stale write applied: job {job_id} lease {token} wrote {w.outcome} after "
                    f"lease {early[0].lease_token} had claimed it"
                )
            elif w.outcome in AT_REST and newer and not _retried_before(retried, newer[0]):
                bad.append(
                    f"job {job_id} ran again (lease {newer[0].lease_token}) after lease {token} "
                    f"wrote {w.outcome}"
                )
        elif w.lost and w.lost_at is not None:
            if any(e.start <= w.lost_at + 0.001 for e in newer):
                rejected += 1
            if any(
                e.start <= w.lost_at + 0.001 and w.lost_at <= _wrote_at(e, logged) + 0.001
                for e in newer
            ):
                by_token += 1
    return {"rejected": rejected, "by_token": by_token, "applied": applied}


def _retried_before(retried: Mapping[str, list[float]], e: Execution) -> bool:
    """Whether a bulk retry naming `e`'s job was sent before `e` started."""
    return any(at <= e.start for at in retried.get(e.job_id, ()))


def _wrote_at(e: Execution, logged: Mapping[tuple[str, int], Write]) -> float:
    """When execution `e`'s own outcome write happened, at the latest."""
    w = logged.get((e.job_id, e.lease_token))
    if w is not None and w.finished_at is not None:
        return w.finished_at
    return float("inf")


def _check_overlaps(
    per_job: Mapping[str, list[Execution]],
    logged: Mapping[tuple[str, int], Write],
    hits: Sequence[Disturbance],
    lease: float,
    tolerance: float,
    bad: list[str],
) -> None:
    """A newer execution must not start while an older one still holds a valid lease (see
    `lease_valid_until`)."""
    for job_id, runs in per_job.items():
        for i, a in enumerate(runs):
            valid_until = lease_valid_until(a, attempt_end(a, logged), hits, lease)
            for b in runs[i + 1 :]:
                overlap = valid_until - b.start
                if overlap > tolerance:
                    bad.append(
                        f"job {job_id}: lease {b.lease_token} started {overlap:.2f}s before "
                        f"lease {a.lease_token} ended or expired"
                    )


def _explain_reruns(
    per_job: Mapping[str, list[Execution]],
    logged: Mapping[tuple[str, int], Write],
    killed: set[int],
    paused: set[int],
    hits: Sequence[Disturbance],
    retried: Mapping[str, list[float]],
    bad: list[str],
) -> tuple[Counter[str], int]:
    """Why each execution after a job's first one happened; unexplained ones are violations.

    A lost lease explains a re-run only when a fault hit its holder between its start and
    the re-run: under heartbeats, a holder that runs undisturbed never loses its lease.
    """
    causes: Counter[str] = Counter()
    after_success = 0
    for job_id, runs in per_job.items():
        for a, b in itertools.pairwise(runs):
            w = logged.get((a.job_id, a.lease_token))
            if w is not None and w.applied and w.outcome == "retried":
                cause = "retry"
            elif w is not None and w.applied and w.outcome == "released":
                cause = "shutdown release"
            elif (
                w is not None and w.applied and w.outcome in AT_REST and _retried_before(retried, b)
            ):
                cause = BULK_RETRY
            elif a.pid in killed and (w is None or w.outcome is None):
                cause = "crash"
            elif a.pid in paused:
                cause = "paused past lease"
            elif w is not None and (w.lost or w.renew_lost_at is not None):
                if not any(d.hits(a.pid, a.start, b.start, a.job_id) for d in hits):
                    bad.append(
                        f"job {job_id}: lease {a.lease_token} was lost while its holder "
                        f"(pid {a.pid}) ran undisturbed, and lease {b.lease_token} re-ran it"
                    )
                    continue
                cause = "lease lost in a fault"
            else:
                bad.append(
                    f"job {job_id}: lease {b.lease_token} re-ran the job after lease "
                    f"{a.lease_token} without a crash, pause, lost lease or retry to explain it"
                )
                continue
            causes[cause] += 1
            if cause != "retry" and a.outcome == "ok":
                after_success += 1
    return causes, after_success


def _check_lost_leases(
    per_job: Mapping[str, list[Execution]],
    logged: Mapping[tuple[str, int], Write],
    hits: Sequence[Disturbance],
    bad: list[str],
) -> int:
    """Leases lost (by a renewal, or an outcome write that matched no row) while no fault
    touched their holder as the holder of that job. Returns how many; those whose job ran
    again are violations of `_explain_reruns` already, the others are reported here (a job
    cancelled, or dead-lettered by recovery, runs no more, yet its lease was lost)."""
    count = 0
    for job_id, runs in per_job.items():
        for i, a in enumerate(runs):
            w = logged.get((a.job_id, a.lease_token))
            if w is None or w.applied:
                continue  # a renewal that raced the attempt's own outcome write lost nothing
            at = w.renew_lost_at if w.renew_lost_at is not None else w.lost_at
            if at is None or any(d.hits(a.pid, a.start, at, job_id) for d in hits):
                continue
            count += 1
            if i + 1 < len(runs):
                continue  # `_explain_reruns` says it, naming the lease that re-ran the job
            bad.append(
                f"job {job_id}: lease {a.lease_token} was lost while its holder (pid {a.pid}) "
                "ran undisturbed"
            )
    return count


def _locks(
    faults: Sequence[Fault],
    per_job: Mapping[str, list[Execution]],
    logged: Mapping[tuple[str, int], Write],
) -> list[dict[str, Any]]:
    """Each row-locking fault: how, how many rows, and the leases lost meanwhile, of the
    locked jobs (explained) and of the others (each also a violation, if undisturbed)."""
    found = []
    for f in faults:
        if f.kind not in LOCK_KINDS:
            continue
        since = f.stopped_at if f.stopped_at is not None else f.injected_at
        until = (f.healed_at or since) + 2 * CANCEL_MARGIN
        locked = set(f.locked_jobs)
        lost: Counter[str] = Counter()
        for runs in per_job.values():
            for e in runs:
                w = logged.get((e.job_id, e.lease_token))
                at = None if w is None or w.applied else (w.renew_lost_at or w.lost_at)
                if at is not None and since <= at <= until:
                    lost["locked" if e.job_id in locked else "free"] += 1
        found.append(
            {
                "kind": f.kind,
                "via": f.detail.get("via"),
                "jobs_taken": f.detail.get("asked", len(locked)),
                "jobs_locked": len(locked),
                "seen_locked": f.detail.get("seen_locked"),
                "jobs_free": f.detail.get("bystanders"),
                "held_seconds": round((f.healed_at or since) - since, 1),
                "leases_lost_locked": lost["locked"],
                "leases_lost_free": lost["free"],
            }
        )
    return found


def _check_listener_cuts(
    faults: Sequence[Fault],
    cancels: Sequence[CancelRequest],
    per_job: Mapping[str, list[Execution]],
    logged: Mapping[tuple[str, int], Write],
    paths: Mapping[tuple[str, int], str],
    lease: float,
    bad: list[str],
) -> list[dict[str, Any]]:
    """Each `cut_listener` fault must have cut something and proven something: listeners
    terminated, all back within RECONNECT_LIMIT, and at least one running probe stopped by
    its cancel (answered 202). How soon each stopped (`check_cancels` holds each to one
    renewal interval plus its margin from the answer) is summarized: from the request, from
    the answer, and, for those asked before the listeners were all back, from their return
    (negative: before it); the cancel asked once they were back apart; and how each holder
    heard of its cancel (`via`: the notification, a renewal)."""
    found = []
    for f in faults:
        if f.kind != CUT_LISTENER:
            continue
        d = f.detail
        jobs = set(d.get("jobs", ()))
        asked = [r for r in cancels if r.mode == CUT_MODE and r.job_id in jobs]
        back_at = d.get("back_at")
        cut_at = d.get("cut_at", f.injected_at)
        if not d.get("terminated"):
            bad.append("cut_listener: no LISTEN connection was terminated")
        if back_at is None:
            bad.append(
                f"cut_listener: the workers' listeners were not all back within "
                f"{RECONNECT_LIMIT:g}s of the cut"
            )
        from_request, from_answer, from_back, once_back = [], [], [], []
        answers: Counter[str] = Counter()
        via: Counter[str] = Counter()
        after_back = set(d.get("after_back", ()))
        for job_id in sorted(jobs):
            mine = sorted((r for r in asked if r.job_id == job_id), key=lambda r: r.sent_at)
            first = next((r for r in mine if r.answered), None)
            answers[str(first.status_code) if first else "none"] += 1
            if first is None or first.status_code != 202 or first.answered_at is None:
                continue
            held = [e for e in per_job.get(job_id, []) if e.attempt == first.attempts]
            if not held:
                continue
            e = max(held, key=lambda e: e.lease_token)
            end = attempt_end(e, logged)
            if e.outcome != "cancelled" or end is None:
                continue
            via[paths.get((e.job_id, e.lease_token), "unknown")] += 1
            if job_id in after_back:
                once_back.append(end - max(first.sent_at, e.start))
                continue
            from_request.append(end - max(first.sent_at, e.start))
            from_answer.append(end - max(first.answered_at, e.start))
            if back_at is not None and first.sent_at < back_at:
                from_back.append(end - back_at)
        if jobs and not from_request and not once_back:
            bad.append(
                "cut_listener: no running job was stopped by a cancel asked around the cut "
                f"(answers {dict(sorted(answers.items()))})"
            )
        found.append(
            {
                "terminated": d.get("terminated"),
                "listeners_before": d.get("listeners_before"),
                "back_after_seconds": None if back_at is None else round(back_at - cut_at, 2),
                "cancels": len(jobs),
                "answers": dict(sorted(answers.items())),
                "stopped": len(from_request) + len(once_back),
                "via": dict(sorted(via.items())),
                "stop_seconds": _spread(from_request),
                "stop_after_answer_seconds": _spread(from_answer),
                "stop_after_listeners_back_seconds": _spread(from_back),
                "stop_seconds_once_back": _spread(once_back),
                "limit_seconds": round(lease / RENEWALS_PER_LEASE + CANCEL_MARGIN, 2),
            }
        )
    return found


def _check_rollout(
    r: Rollout,
    acks: Sequence[Ack],
    execs: Mapping[tuple[str, int], Execution],
    logged: Mapping[tuple[str, int], Write],
    server_errors: Sequence[ServerError],
    bad: list[str],
) -> dict[str, Any]:
    """The rollout phase: the head migrated the schema to its newest revision while the old
    release served, no service that should serve turned unready, every old service exited 0,
    no API answered 5xx while it went on, and each release did work in it."""
    for problem in r.problems:
        bad.append(f"rollout: {problem}")
    if r.migration_exit is None:
        bad.append("rollout: the head's migration never ran")
    elif r.migration_exit != 0:
        bad.append(
            f"rollout: alembic upgrade head exited {r.migration_exit} while the previous "
            f"release served: {r.migration_output[-300:]}"
        )
    if r.migration_exit == 0 and r.to_revision != r.target_revision:
        bad.append(
            f"rollout: the schema is at {r.to_revision} after the migration, not at the "
            f"head's {r.target_revision}"
        )
    for name, code in r.old_exits:
        if code != 0:
            how = "was killed after not stopping" if code is None else f"exited {code}"
            bad.append(f"rollout: {name} {how} on SIGTERM")
    unready: dict[str, list[float]] = defaultdict(list)
    for name, at in r.unready:
        unready[name].append(at)
    for name, times in sorted(unready.items()):
        bad.append(
            f"rollout: {name} was not ready {len(times)} times while it should serve, first "
            f"{times[0] - r.started_at:.1f}s into the phase{_during_migration(r, times[0])}"
        )
    during = [e for e in server_errors if r.started_at <= e.at <= r.ended_at]
    for e in during[:20]:
        bad.append(
            f"rollout: {e.request} answered {e.status_code} by {e.api} "
            f"{e.at - r.started_at:.1f}s into the phase{_during_migration(r, e.at)}"
        )
    if len(during) > 20:
        bad.append(f"rollout: {len(during) - 20} more 5xx answers while the phase went on")
    in_phase = [
        a for a in acks if a.answered_at is not None and r.started_at <= a.answered_at <= r.ended_at
    ]
    by_old_api = sum(a.api in r.old_apis for a in in_phase)
    by_new_api = sum(a.api in r.new_apis for a in in_phase)
    old_pids = set(r.old_worker_pids)
    by_old = [e for e in execs.values() if e.pid in old_pids]
    by_new = [
        e for e in execs.values()
        if e.pid not in old_pids and r.started_at <= e.start <= r.ended_at
    ]  # fmt: skip
    if not by_old_api:
        bad.append("rollout: the previous release's API acknowledged no job")
    if not by_old:
        bad.append("rollout: the previous release's workers ran no job")
    if r.new_ready_at is not None and not by_new_api:
        bad.append("rollout: the head's APIs acknowledged no job while both releases served")
    migrating = (r.migration_started_at or 0.0, r.migration_ended_at or 0.0)
    return {
        "previous": r.previous,
        "from_revision": r.from_revision,
        "to_revision": r.to_revision,
        "target_revision": r.target_revision,
        "revisions_applied": list(r.revisions_applied),
        "migration_exit": r.migration_exit,
        "migration_seconds": round(migrating[1] - migrating[0], 2)
        if r.migration_ended_at
        else None,
        "phase_seconds": round(r.ended_at - r.started_at, 1),
        "acknowledged_by_old_apis": by_old_api,
        "acknowledged_by_new_apis": by_new_api,
        "executions_by_old_workers": len(by_old),
        "executions_by_new_workers": len(by_new),
        "executions_during_migration": sum(
            migrating[0] <= e.start <= migrating[1] for e in execs.values()
        ),
        "acknowledged_during_migration": sum(
            migrating[0] <= (a.answered_at or 0.0) <= migrating[1] for a in acks
        ),
        "released_by_old_workers": sum(
            (w := logged.get((e.job_id, e.lease_token))) is not None
            and w.applied
            and w.outcome == "released"
            for e in by_old
        ),
        "old_exits": dict(r.old_exits),
        "unready_samples": len(r.unready),
        "server_errors": len(during),
    }


def _during_migration(r: Rollout, at: float) -> str:
    start, end = r.migration_started_at, r.migration_ended_at
    if start is not None and end is not None and start <= at <= end:
        return ", during the migration"
    return ""


def _check_resumed_holders(
    per_job: Mapping[str, list[Execution]],
    logged: Mapping[tuple[str, int], Write],
    faults: Sequence[Fault],
    lease: float,
    bad: list[str],
) -> int:
    """A holder paused until its job was claimed again must stop once resumed: its next
    heartbeat finds the lease run out (or renews nothing) and stops the attempt. Returns
    how many were stopped that way.

    Only superseded holders are held to it: a job claimed shortly before the pause may
    still have had its lease at the resume, renewed it, and rightly run on."""
    stopped = 0
    limit = lease / RENEWALS_PER_LEASE + RESUME_MARGIN
    for f in faults:
        if not f.paused_pids or f.healed_at is None:
            continue
        paused_at = f.stopped_at if f.stopped_at is not None else f.injected_at
        resumed_at = f.healed_at
        for e in (e for runs in per_job.values() for e in runs):
            end = attempt_end(e, logged)
            if e.pid not in f.paused_pids or e.start > paused_at:
                continue
            if end is not None and end <= paused_at:
                continue
            newer = per_job[e.job_id]
            # The injector resumes the holder once it sees the newer claim committed; that
            # claim's handler may log its start a moment later.
            claimed_by = resumed_at + CLAIM_TO_START
            if not any(b.lease_token > e.lease_token and b.start <= claimed_by for b in newer):
                continue
            ran_on = (end if end is not None else float("inf")) - f.healed_at
            if ran_on > limit:
                bad.append(
                    f"job {e.job_id}: lease {e.lease_token}'s holder (pid {e.pid}) ran on "
                    f"{ran_on:.1f}s after it was resumed past its lease"
                )
                continue
            w = logged.get((e.job_id, e.lease_token))
            if w is not None and w.renew_lost_at is not None and e.outcome == "cancelled":
                stopped += 1
    return stopped


def _check_holds(faults: Sequence[Fault], bad: list[str]) -> list[dict[str, Any]]:
    """Each held_horizon fault must have held the horizon, or the run proved nothing under
    it: pg_stat_activity showed the idle transaction's backend_xid and the reader's
    backend_xmin, and both at once for some time. Returns what each held, for the summary."""
    found = []
    for f in faults:
        if f.kind != HELD_HORIZON:
            continue
        h = f.hold
        if h is None:
            bad.append("held_horizon: no record of the hold")
            continue
        if not h.idle_xids:
            bad.append("held_horizon: the idle transaction never held an xid (backend_xid)")
        if not h.reader_xmins:
            bad.append("held_horizon: the repeatable-read reader never held a backend_xmin")
        if h.idle_xids and h.reader_xmins and h.held_seconds <= 0:
            bad.append("held_horizon: its two sessions never held the horizon at once")
        found.append(
            {
                "from_seconds": round(h.started_at - h.phase_started_at, 1),
                "to_seconds": round(h.ended_at - h.phase_started_at, 1),
                "planned_seconds": h.planned_seconds,
                "held_seconds": h.held_seconds,
                "reconnects": len(h.reconnects),
                "idle_xids": list(h.idle_xids),
                "reader_xmins": list(h.reader_xmins),
                "max_age": h.max_age,
                "dead_tuples_first": h.dead_tuples[0] if h.dead_tuples else None,
                "dead_tuples_max": max(h.dead_tuples, default=None),
                "dead_tuples_samples": list(h.dead_tuples),
                "reads": h.reads,
            }
        )
    return found


def _long_jobs(
    rows: Sequence[JobRow],
    per_job: Mapping[str, list[Execution]],
    logged: Mapping[tuple[str, int], Write],
) -> dict[str, float]:
    """The long jobs: how many, completed, cancelled, run exactly once, and longest
    execution."""
    long_rows = [row for row in rows if row.type == LONG_TYPE]
    runs = [e for row in long_rows for e in per_job.get(row.id, [])]
    spans = [end - e.start for e in runs if (end := attempt_end(e, logged)) is not None]
    return {
        "jobs": len(long_rows),
        "completed": sum(row.status == "completed" for row in long_rows),
        "cancelled": sum(row.status == "cancelled" for row in long_rows),
        "run_once": sum(len(per_job.get(row.id, [])) == 1 for row in long_rows),
        "longest_execution_seconds": round(max(spans, default=0.0), 1),
    }


def _check_attempts(
    rows: Sequence[JobRow], execs: Mapping[tuple[str, int], Execution], bad: list[str]
) -> None:
    for row in rows:
        if row.attempts > row.max_attempts:
            bad.append(f"job {row.id} has {row.attempts} attempts of {row.max_attempts}")
        if row.status == "dead_letter" and row.attempts != row.max_attempts:
            used = f"{row.attempts} of {row.max_attempts}"
            bad.append(f"job {row.id} was dead-lettered after {used} attempts")
    for e in execs.values():
        if e.attempt > e.max_attempts or e.attempt < 1:
            bad.append(f"job {e.job_id} ran attempt {e.attempt} of {e.max_attempts}")


def _check_final_lease(
    rows: Sequence[JobRow], execs: Mapping[tuple[str, int], Execution], bad: list[str]
) -> None:
    expected = {"completed": "ok", "failed": "permanent"}
    for row in rows:
        want = expected.get(row.status)
        if want is None:
            continue
        e = execs.get((row.id, row.lease_token))
        if e is None or e.outcome != want:
            got = "no execution" if e is None else f"an execution that ended {e.outcome}"
            bad.append(
                f"job {row.id} is {row.status} under lease {row.lease_token}, which had {got}"
            )


def _token_gaps(rows: Sequence[JobRow], per_job: Mapping[str, list[Execution]]) -> int:
    """Claims whose execution never recorded a start (the process died in between)."""
    return sum(max(0, row.lease_token - len(per_job.get(row.id, []))) for row in rows)


def _outcomes_by_type(rows: Sequence[JobRow]) -> dict[str, dict[str, int]]:
    table: dict[str, Counter[str]] = defaultdict(Counter)
    for row in rows:
        table[row.type][row.status] += 1
    return {t: dict(sorted(c.items())) for t, c in sorted(table.items())}


def recovery_table(faults: Sequence[Fault]) -> dict[str, dict[str, float]]:
    """Seconds from each fault's removal (or injection) to recovery: p50 and max by kind."""
    times: dict[str, list[float]] = defaultdict(list)
    for f in faults:
        if f.recovered_at is not None:
            times[f.kind].append(f.recovered_at - (f.healed_at or f.injected_at))
    return {
        kind: {"p50": round(statistics.median(v), 2), "max": round(max(v), 2)}
        for kind, v in sorted(times.items())
    }
