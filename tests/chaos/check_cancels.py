"""The chaos checker's rules for cancels: what each answer to `POST /jobs/{id}/cancel`
promises, held against the handlers' executions, the workers' writes and the job's final
row (in the table, or as retention deleted it).

- 200 (cancelled at once; it was pending or dead_letter): the job ends `cancelled`, no
  handler of it was still running when the answer came, and it never runs again: no
  claim after the cancel, and no execution starting after the answer. A holder hit by a
  fault is the exception to the last two: its lease ran out, the job went back to pending
  and was cancelled, while the holder's handler ran on, or only then started;
- 202 (asked of the worker holding it): the job ends `cancelled`, or in the outcome that
  won the race (`completed`, `failed`, `dead_letter`), never pending or processing; no
  claim after the cancel; the attempt holding it stops within one renewal interval plus
  CANCEL_MARGIN of the answer (the announcement stops it at once, the holder's next
  renewal if the announcement was missed) unless a fault hit its holder from a lease
  before the request until then, or its process was killed; and if the job
  ended `cancelled`, that attempt was stopped, failed on its own (its retry became the
  cancel) or its holder was hit by a fault within a lease of its return: an attempt that
  returned (or raised PermanentError) to an undisturbed holder has its outcome stand;
- 409 (finished already): the job ends `completed`, `failed` or `cancelled`;
- 404: only once retention has deleted the job;
- a job that ended `cancelled` was asked to be before it finished (by a request of its own,
  or a bulk cancel whose filter matches it), and no `completed`,
  `failed` or `dead_letter` write was applied for it.

"No claim after the cancel" is read from attempt numbers: a 200 or 202 answer carries the
job's `attempts` a, and every claim adds one, so an execution of attempt > a that started
after the request was sent was claimed after the cancel. (An attempt given back by a
release belongs to an execution that ended before the cancel.)
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from jobqueue_worker.heartbeat import RENEWALS_PER_LEASE
from tests.chaos.evidence import (
    BulkAction,
    CancelRequest,
    Disturbance,
    Execution,
    JobRow,
    Write,
    attempt_end,
    disturbed,
)

# Beyond one renewal interval, how late an attempt may stop after its 202 on a loaded machine.
CANCEL_MARGIN = 2.0
RACE_WINNERS = ("completed", "failed", "dead_letter")
# The client's clock and the database's are the same machine's; a little rounding.
CLOCK_MARGIN = 0.001


def check_cancels(
    cancels: Sequence[CancelRequest],
    finals: Mapping[str, JobRow],
    per_job: Mapping[str, list[Execution]],
    logged: Mapping[tuple[str, int], Write],
    hits: Sequence[Disturbance],
    killed: Collection[int],
    pruned_at: Mapping[str, float],
    lease: float,
    bad: list[str],
    bulk: Sequence[BulkAction] = (),
) -> dict[str, Any]:
    """Every rule above; the cancels' summary. `bulk`: the bulk actions, whose cancels
    count as asked of every job their filter matches."""
    asked: dict[str, list[CancelRequest]] = defaultdict(list)
    for r in sorted(cancels, key=lambda r: r.sent_at):
        asked[r.job_id].append(r)
    stops: list[float] = []
    stops_by_mode: dict[str, list[float]] = defaultdict(list)
    stale_starts = 0
    limit = lease / RENEWALS_PER_LEASE + CANCEL_MARGIN
    for job_id, requests in asked.items():
        final = finals.get(job_id)
        runs = per_job.get(job_id, [])
        for r in requests:
            if r.status_code == 404:
                gone = pruned_at.get(job_id)
                if gone is None or r.answered_at is None or gone > r.answered_at + CLOCK_MARGIN:
                    bad.append(f"cancel of job {job_id} answered 404 while the job existed")
            if final is None or r.status_code not in (200, 202, 409):
                continue
            if r.status_code == 409 and final.status not in ("completed", "failed", "cancelled"):
                bad.append(f"cancel of job {job_id} answered 409, but the job ended {final.status}")
            if r.status_code in (200, 202):
                stale_starts += _no_run_after(r, final, runs, logged, hits, lease, bad)
            if r.status_code == 202:
                stop = _holder_stopped(r, final, runs, logged, hits, killed, lease, limit, bad)
                if stop is not None:
                    stops.append(stop)
                    stops_by_mode[requests[0].mode].append(stop)
    written: dict[str, list[Write]] = defaultdict(list)
    for w in logged.values():
        written[w.job_id].append(w)
    for job_id, final in finals.items():
        if final.status == "cancelled":
            times = [r.sent_at for r in asked.get(job_id, [])] + [
                a.sent_at
                for a in bulk
                if a.action == "cancel" and a.matches(job_id, final.type, final.queue)
            ]
            _ended_cancelled(final, times, written.get(job_id, []), bad)

    answers = Counter(_answer(requests) for requests in asked.values())
    return {
        "jobs": len(asked),
        "requests": len(cancels),
        "answers": dict(sorted(answers.items())),
        "by_mode": _by_mode(asked.values()),
        "ended_cancelled": sum(finals[j].status == "cancelled" for j in asked if j in finals),
        "lost_races": sum(
            j in finals and finals[j].status in RACE_WINNERS and _answer(rs) == "202"
            for j, rs in asked.items()
        ),
        "stop_seconds": _spread(stops),
        "stop_seconds_by_mode": {m: _spread(v) for m, v in sorted(stops_by_mode.items())},
        "stale_starts_after_cancel": stale_starts,
    }


def _by_mode(asked: Iterable[Sequence[CancelRequest]]) -> dict[str, dict[str, int]]:
    """The answers by when the client chose to ask (its first request's mode)."""
    modes: dict[str, Counter[str]] = defaultdict(Counter)
    for requests in asked:
        modes[requests[0].mode][_answer(requests)] += 1
    return {mode: dict(sorted(c.items())) for mode, c in sorted(modes.items())}


def _answer(requests: Sequence[CancelRequest]) -> str:
    """The first definitive answer the client got for a job, or `none`."""
    for r in requests:
        if r.answered:
            return str(r.status_code)
    return "none"


def _no_run_after(
    r: CancelRequest,
    final: JobRow,
    runs: Sequence[Execution],
    logged: Mapping[tuple[str, int], Write],
    hits: Sequence[Disturbance],
    lease: float,
    bad: list[str],
) -> int:
    """A 200 or 202: the job ends as promised and is never claimed again; a 200 job was not
    running and does not run again either. Returns the executions that started after a 200
    from an earlier claim, their holders hit by a fault."""
    allowed = ("cancelled",) if r.status_code == 200 else ("cancelled", *RACE_WINNERS)
    if final.status not in allowed:
        bad.append(
            f"cancel of job {r.job_id} answered {r.status_code}, but the job ended {final.status}"
        )
    stale = 0
    a = r.attempts if r.attempts is not None else 0
    at_once = r.status_code == 200 and r.answered_at is not None
    for e in runs:
        if e.start < r.sent_at:
            end = attempt_end(e, logged)
            ran_on = end is None or (r.answered_at is not None and end > r.answered_at)
            if (
                at_once
                and ran_on
                and not disturbed(hits, e.pid, e.start, r.answered_at or 0, e.job_id)
            ):
                bad.append(
                    f"job {r.job_id} was cancelled at once (200) while lease {e.lease_token}'s "
                    f"handler (pid {e.pid}) still ran"
                )
            continue
        if e.attempt > a:
            bad.append(
                f"job {r.job_id}: attempt {e.attempt} (lease {e.lease_token}) was claimed after "
                f"a cancel answered {r.status_code} at attempt {a}"
            )
        elif r.status_code == 200 and r.answered_at is not None and e.start > r.answered_at:
            if disturbed(hits, e.pid, r.sent_at - lease, e.start, e.job_id):
                stale += 1
            else:
                bad.append(
                    f"job {r.job_id}: lease {e.lease_token} started "
                    f"{e.start - r.answered_at:.2f}s after the job was cancelled (200)"
                )
    return stale


def _holder(r: CancelRequest, runs: Sequence[Execution]) -> Execution | None:
    """The execution holding the job when a 202 was answered: the newest of its attempt."""
    held = [e for e in runs if e.attempt == r.attempts]
    return max(held, key=lambda e: e.lease_token) if held else None


def _holder_stopped(
    r: CancelRequest,
    final: JobRow,
    runs: Sequence[Execution],
    logged: Mapping[tuple[str, int], Write],
    hits: Sequence[Disturbance],
    killed: Collection[int],
    lease: float,
    limit: float,
    bad: list[str],
) -> float | None:
    """A 202: the holder stops in time, and a job that ended cancelled had its holder
    stopped, failing or disturbed. Returns how long the holder took to stop after the
    request was sent (or its handler started, if later), if the cancel stopped it."""
    e = _holder(r, runs)
    if e is None or r.answered_at is None:
        return None  # the claim's process died before its handler started
    end = attempt_end(e, logged)
    asked_at = max(r.answered_at, e.start)
    ran_on = (end if end is not None else float("inf")) - asked_at
    # Only a fault around the request excuses a late stop: one that cut the holder off
    # (its announcement lost, its renewals failing) shortly before or while it should stop.
    excused = disturbed(hits, e.pid, r.sent_at - lease, asked_at + limit, e.job_id) or (
        end is None and e.pid in killed
    )
    if ran_on > limit and not excused:
        bad.append(
            f"job {r.job_id}: lease {e.lease_token}'s handler (pid {e.pid}) ran on "
            f"{ran_on:.2f}s after its cancel was answered 202"
        )
    # Its outcome write may have been lost only to a fault from a lease before its handler
    # returned (the lease may have run out unnoticed) until a lease after (the write).
    returned = e.outcome in ("ok", "permanent") and end is not None
    if (
        final.status == "cancelled"
        and returned
        and not disturbed(hits, e.pid, (end or 0.0) - lease, (end or 0.0) + lease, e.job_id)
    ):
        bad.append(
            f"job {r.job_id} ended cancelled, but lease {e.lease_token}'s handler "
            f"returned {e.outcome} to its undisturbed holder (pid {e.pid})"
        )
    if e.outcome == "cancelled" and end is not None and end > r.sent_at:
        return end - max(r.sent_at, e.start)
    return None


def _ended_cancelled(
    final: JobRow, asked_at: Sequence[float], written: Sequence[Write], bad: list[str]
) -> None:
    """A job that ended cancelled was asked to be first, and nothing else was recorded as
    its outcome, but a dead letter's: a dead letter may be cancelled (no worker holds it),
    by a cancel asked after it was written."""
    before = final.finished_at if final.finished_at is not None else float("inf")
    if not any(at <= before + CLOCK_MARGIN for at in asked_at):
        asks = ", ".join(f"{at:.3f}" for at in sorted(asked_at)) or "none"
        bad.append(
            f"job {final.id} ended cancelled, but no cancel was asked before it finished "
            f"(type {final.type}, queue {final.queue}, attempt {final.attempts}, finished at "
            f"{before:.3f}; cancels asked at {asks}; writes: "
            + (", ".join(f"{w.lease_token}:{w.outcome}" for w in written) or "none")
            + ")"
        )
    for w in written:
        died = w.finished_at if w.outcome == "dead_letter" else None
        if died is not None and any(at >= died - CLOCK_MARGIN for at in asked_at):
            continue
        if w.applied and w.outcome in RACE_WINNERS:
            bad.append(
                f"job {final.id} ended cancelled after lease {w.lease_token} wrote {w.outcome}"
            )


def _spread(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"p50": round(statistics.median(values), 3), "max": round(max(values), 3)}
