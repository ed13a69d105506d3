"""The chaos run: start the system, load it while injecting faults, drain, stop, check.

    python -m tests.chaos.run [--jobs N] [--duration S] [--json PATH] [--seed N] [--kinds a,b]
                              [--retention S] [--await-prune S] [--no-cancels]
                              [--horizon-seconds S] [--no-rollout] [--previous COMMIT]

Starts a throwaway PostgreSQL cluster; unless `--no-rollout`, first the rollout phase
(`tests.chaos.rollout`): the previous release's (`--previous`, by default
`rollout.PREVIOUS_RELEASE`) schema, API and workers under load while the head's
`alembic upgrade head` runs, then the head's services beside them, then the old ones
stopped. Then 2 `jobqueue-api` and 3 `jobqueue-worker`
services (2 processes each, deleting finished jobs after `--retention` seconds),
each behind a fault proxy; submits N jobs through the APIs over the rollout and the fault
phase, cancelling a sample of them, while `tests.chaos.faults` injects one fault after
another and, beside them, holds back the MVCC horizon for `--horizon-seconds`
(`tests.chaos.horizon`); then restarts whatever is down, waits until every
acknowledged job is at rest (or deleted by retention), stops every service
gracefully (exit status 0 expected) and runs the invariant checker. Prints the
summary table, writes it as JSON if asked, and exits 1 if any invariant was
broken. Everything it started is removed at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.chaos import audit, faults, horizon, rollout
from tests.chaos.admin import Operator
from tests.chaos.checker import Report, check
from tests.chaos.evidence import Fault, JobRow, Rollout
from tests.chaos.load import Load
from tests.chaos.system import (
    DEFAULT_RETENTION,
    KEY_LIMIT,
    LEASE_SECONDS,
    TYPE_LIMIT,
    System,
    retention_ages,
    wait_until,
)

START_LIMIT = 120.0
DRAIN_LIMIT = 180.0


def run_chaos(
    *,
    jobs: int,
    duration: float,
    seed: int,
    kinds: Sequence[str] = faults.KINDS,
    gap: tuple[float, float] = (1.0, 3.0),
    log: Callable[[str], None] = print,
    keep: bool = False,
    retention: float = DEFAULT_RETENTION,
    cancels: bool = True,
    await_prune: float = 0.0,
    horizon_seconds: float = horizon.DEFAULT_SECONDS,
    previous: str | None = None,
) -> Report:
    """One complete run; the report's violations are empty when every guarantee held.

    `await_prune`: after draining, wait up to this long for retention to have deleted a
    job, if none was yet (a short run may end before the retention leader's second round).
    `horizon_seconds`: how long the MVCC horizon is held during the faults
    (`tests.chaos.horizon.stretch`; 0: not at all). `previous`: a commit of this repository
    to roll out from before the faults (`tests.chaos.rollout`); None: no rollout phase."""
    started = time.time()
    run_dir = Path(tempfile.mkdtemp(prefix="jobqueue-chaos-"))
    release = rollout.checkout(previous, run_dir / "previous") if previous else None
    system = System(run_dir, retention=retention, previous=release, replicated="failover" in kinds)
    rolled: Rollout | None = None
    load: Load | None = None
    held: faults.HeldHorizon | None = None
    operator: Operator | None = None
    problems: list[str] = []
    try:
        system.start()
        if wait_until(system.all_ready, START_LIMIT) is None:
            raise RuntimeError(f"the services were not ready within {START_LIMIT}s")
        rollout_for = rollout.ESTIMATE if release is not None else 0.0
        log(
            f"system ready in {time.time() - started:.1f}s; {jobs} jobs over "
            f"{duration + rollout_for:g}s"
        )
        load = Load(
            [api.url("") for api in system.apis],
            jobs,
            spread=(duration + rollout_for) * 0.8,
            seed=seed,
            run_id=f"chaos-{uuid.uuid4().hex[:8]}",
            cancels=cancels,
            keys=release is None,
        )
        load.start()
        if release is not None:
            rolled = rollout.run(system, load, log)
            load.open_keys()
            if wait_until(system.all_ready, START_LIMIT) is None:
                problems.append("not every service was ready after the rollout")
        chaos = faults.Chaos(system, load, random.Random(seed), log=log)
        held_for = horizon.stretch(duration, horizon_seconds)
        if held_for is not None:
            held = faults.HeldHorizon(chaos, *held_for)
            held.start()
        current = load
        operator = Operator(
            lambda: current.api_urls, lambda: list(current.stats.retryable), duration, log
        )
        operator.start()
        faults.run_schedule(chaos, list(kinds), until=time.time() + duration, gap=gap)
        operator.finish()
        problems += operator.failures
        if held is not None:
            fault = held.finish()
            if fault is None:
                problems.append("held_horizon: the holder left no record")
            else:
                chaos.faults.append(fault)
        problems += chaos.problems
        if not load.wait(DRAIN_LIMIT):
            problems.append("the client did not finish submitting")
        log(f"faults done; {len(load.stats.acks)} jobs acknowledged; draining")

        for service in system.services:
            if not service.current.alive():
                problems.append(f"{service.name} was down at the end of the fault phase")
                system.launch(service)
        if wait_until(system.all_ready, START_LIMIT) is None:
            problems.append("not every service was ready after the fault phase")
        acked = sorted({a.job_id for a in load.stats.acks})
        drained_at = wait_until(lambda: _unsettled(system, acked) == 0, DRAIN_LIMIT, 0.5)
        if drained_at is None:
            problems.append(f"{_unsettled(system, acked)} jobs were not at rest after draining")
        if await_prune > 0 and not audit.count(system, acked):
            log(f"waiting up to {await_prune:g}s for retention's first deletion")
            if wait_until(lambda: audit.count(system, acked) > 0, await_prune, 0.5) is None:
                problems.append(f"retention deleted no job within {await_prune:g}s of the drain")
        problems += _stop_all(system)

        rows = _rows(system)
        entries, non_json = _service_logs(system)
        report = check(
            rows,
            load.stats.acks,
            system.execution_records(),
            entries,
            chaos.faults,
            lease_duration=LEASE_SECONDS,
            cancels=load.stats.cancels,
            pruned=audit.pruned(system),
            retention=retention_ages(retention),
            rollout=rolled,
            server_errors=load.stats.server_errors,
            key_limit=KEY_LIMIT,
            type_limits=dict([TYPE_LIMIT]),
            pauses=operator.pauses,
            bulk=operator.actions,
        )
        if non_json:
            problems.append(f"{non_json} service log lines were not JSON")
        report.violations += problems + load.stats.failures
        report.summary.update(
            {
                "violations": len(report.violations),
                "submission_attempts": load.stats.attempts,
                "submission_retries": dict(sorted(load.stats.retried.items())),
                "unacknowledged": load.stats.unacknowledged,
                "error_log_lines": _errors(entries),
                "failovers": [_failover(f) for f in chaos.faults if f.kind == "failover"],
                "duration_seconds": round(time.time() - started, 1),
                "seed": seed,
            }
        )
        return report
    finally:
        if operator is not None:
            operator.close()
        if held is not None:
            held.stop()
        if load is not None:
            load.close()
        system.close()
        rollout.cleanup(release)
        if keep:
            log(f"service logs and execution records kept in {run_dir}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)


def _failover(fault: Fault) -> dict[str, Any]:
    """A failover's figures: the promotion after the kill, the services' recovery after the
    promotion, the old primary's rejoin after that (as a synchronous standby)."""
    recovered = fault.recovered_at
    healed = fault.healed_at
    return {
        **fault.detail,
        "recovered_seconds": (
            None if recovered is None or healed is None else round(recovered - healed, 2)
        ),
    }


def _unsettled(system: System, ids: list[str]) -> int:
    """Jobs of `ids` not finished: in the table unfinished, or in neither the table nor
    retention's record (the checker calls those lost)."""
    try:
        ((n,),) = system.query(
            f"SELECT count(*) FROM {audit.jobs(system.query)} WHERE id = ANY(%s::uuid[])"
            " AND status NOT IN ('completed', 'failed', 'dead_letter', 'cancelled')",
            (ids,),
        )
        return int(n) + len(ids) - _count(system, ids) - audit.count(system, ids)
    except Exception:
        return len(ids)


def _count(system: System, ids: list[str]) -> int:
    ((n,),) = system.query(
        f"SELECT count(*) FROM {audit.jobs(system.query)} WHERE id = ANY(%s::uuid[])", (ids,)
    )
    return int(n)


def _stop_all(system: System) -> list[str]:
    """SIGTERM every service at once; each must exit 0."""
    for service in system.services:
        service.current.signal(signal.SIGTERM)
    problems = []
    for service in system.services:
        code = service.current.wait(faults.STOP_LIMIT)
        if code is None:
            service.current.kill_group()
            problems.append(f"{service.name} did not stop within {faults.STOP_LIMIT}s")
        elif code != 0:
            problems.append(f"{service.name} exited {code} after SIGTERM at the end")
    return problems


def _rows(system: System) -> list[JobRow]:
    return [
        JobRow(
            str(r[0]),
            r[1],
            r[2],
            r[3],
            r[4],
            r[5],
            r[6],
            bool(r[7]),
            r[8],
            None if r[9] is None else float(r[9]),
        )
        for r in system.query(
            "SELECT id, type, status, attempts, max_attempts, lease_token, idempotency_key,"
            " coalesce(locked_until < now(), false), queue, extract(epoch FROM finished_at)"
            f" FROM {audit.jobs(system.query)}"
        )
    ]


def _service_logs(system: System) -> tuple[list[dict[str, Any]], int]:
    entries, non_json = [], 0
    for _, line in system.service_log_lines():
        try:
            entry = json.loads(line)
        except ValueError:
            non_json += 1
            continue
        if isinstance(entry, dict):
            entries.append(entry)
        else:
            non_json += 1
    return entries, non_json


def _errors(entries: list[dict[str, Any]]) -> dict[str, int]:
    """Error-level service log lines by message (first line, numbers folded)."""
    found = Counter(
        re.sub(r"\d+", "N", str(e.get("msg")).splitlines()[0])[:100]
        for e in entries
        if e.get("level") == "error"
    )
    return dict(found.most_common(10))


# --- output ----------------------------------------------------------------------------


def table(report: Report) -> str:
    s = report.summary
    lines = [
        "| measure | value |",
        "|---|---|",
        f"| jobs submitted (acknowledged) | {s['jobs_submitted']} |",
        f"| completed / failed / dead-lettered / cancelled | {s['completed']} / {s['failed']} / "
        f"{s['dead_lettered']} / {s['cancelled']} |",
        f"| **lost** | **{s['lost']}** |",
        f"| **dead-lettered without ever running** | **{s['never_ran']}** |",
        f"| **executions started before their job was due** | **{s['started_before_due']}** |",
        f"| jobs by queue | {_pairs(s['jobs_by_queue'])} |",
        f"| scheduled jobs (run_at / delay 1–5 s ahead) | {s['scheduled_jobs']} |",
        f"| scheduled jobs: first start after due (p50 / max) | "
        f"{_late(s['scheduled_lateness_seconds'])} |",
        f"| executions (retries by policy) | {s['executions']} ({s['retries']}) |",
        f"| duplicate executions | {s['duplicate_executions']} {_pairs(s['duplicate_causes'])} |",
        f"| duplicates whose earlier run had succeeded | {s['duplicates_after_success']} |",
        f"| stale writes rejected (while a newer claim held the job) | "
        f"{s['stale_writes_rejected']} ({s['stale_writes_rejected_by_token']}) |",
        f"| stale writes applied | {s['stale_writes_applied']} |",
        f"| leases lost on renewal (paused holders stopped by it) | "
        f"{s['leases_lost_on_renewal']} ({s['paused_holders_stopped_by_renewal']}) |",
        f"| **leases lost while their holder ran undisturbed** | "
        f"**{s['leases_lost_undisturbed']}** |",
        f"| renewals that skipped a locked row (`lease not renewed`) | "
        f"{s['renewals_skipped_for_a_locked_row']} |",
        *[_lock_line(x) for x in s.get("locked_rows", [])],
        f"| long jobs (2–3 leases): completed / cancelled / run once / longest execution | "
        f"{_long(s['long_jobs'])} |",
        *_cancel_lines(s["cancels"]),
        *_key_lines(s.get("keys")),
        *_type_lines(s.get("type_limits")),
        *_admin_lines(s.get("pauses"), s.get("bulk"), s.get("runs_after_a_bulk_retry", 0)),
        *_retention_lines(s["retention"]),
        f"| faults injected | {sum(s['faults_injected'].values())} "
        f"{_pairs(s['faults_injected'])} |",
    ]
    for kind, t in s["recovery_seconds"].items():
        lines.append(f"| recovery after {kind} (p50 / max) | {t['p50']}s / {t['max']}s |")
    lines += [_horizon_line(h) for h in s.get("held_horizon", [])]
    lines += [_cut_line(x) for x in s.get("listener_cuts", [])]
    lines += [
        "| failover: promoted after the kill / services recovered after the promotion / "
        f"old primary rejoined, synchronous | {f.get('promoted_seconds')}s / "
        f"{f.get('recovered_seconds')}s / {f.get('rejoined_seconds')}s |"
        for f in s.get("failovers", [])
    ]
    if s.get("rollout"):
        lines += _rollout_lines(s["rollout"])
    if s.get("server_errors"):
        lines.append(f"| 5xx answers to the client (retried) | {_pairs(s['server_errors'])} |")
    lines += [
        f"| submissions retried by the client | {sum(s['submission_retries'].values())} |",
        f"| service log lines at level error | {sum(s['error_log_lines'].values())} |",
        f"| invariant violations | {s['violations']} |",
        f"| run time | {s['duration_seconds']}s |",
    ]
    return "\n".join(lines)


def _horizon_line(h: dict[str, Any]) -> str:
    dead = (
        f"{h['dead_tuples_max']} (from {h['dead_tuples_first']})"
        if h["dead_tuples_max"] is not None
        else "-"
    )
    return (
        "| held_horizon: into the fault phase / held both at once / reconnects / "
        f"max xid age / max n_dead_tup of jobs | {h['from_seconds']}s → {h['to_seconds']}s / "
        f"{h['held_seconds']}s of {h['planned_seconds']:g}s / {h['reconnects']} / "
        f"{h['max_age']} / {dead} |"
    )


def _lock_line(x: dict[str, Any]) -> str:
    seen = "not read" if x["seen_locked"] is None else x["seen_locked"]
    return (
        f"| {x['kind']} ({x['via']}): running jobs' rows taken (seen locked) / free running "
        f"jobs / held / leases lost, locked / free | {x['jobs_taken']} ({seen}) / "
        f"{x['jobs_free']} / {x['held_seconds']}s / {x['leases_lost_locked']} / "
        f"{x['leases_lost_free']} |"
    )


def _cut_line(x: dict[str, Any]) -> str:
    back = "never" if x["back_after_seconds"] is None else f"{x['back_after_seconds']}s"
    return (
        "| cut_listener: listeners cut / back after / cancels (answers) / stopped (heard by) / "
        "stop after the request, p50 / max (asked before the listeners were back: from their "
        "return) / asked once back | "
        f"{x['terminated']} of {x['listeners_before']} / {back} / {x['cancels']} "
        f"{_pairs(x['answers'])} / {x['stopped']} {_pairs(x['via'])} / "
        f"{_late(x['stop_seconds'])} ({_late(x['stop_after_listeners_back_seconds'])}) / "
        f"{_late(x['stop_seconds_once_back'])} |"
    )


def _rollout_lines(r: dict[str, Any]) -> list[str]:
    applied = ", ".join(r["revisions_applied"]) or "none"
    exits = ", ".join(f"{k} {v}" for k, v in r["old_exits"].items())
    took = "-" if r["migration_seconds"] is None else f"{r['migration_seconds']}s"
    return [
        f"| rollout from {r['previous']}: schema / revisions applied / migration (exit) | "
        f"{r['from_revision']} → {r['to_revision']} (head {r['target_revision']}) / {applied} / "
        f"{took} ({r['migration_exit']}) |",
        f"| rollout: acknowledged by old / new APIs; executions by old / new workers; "
        f"during the migration (acknowledged / started) | {r['acknowledged_by_old_apis']} / "
        f"{r['acknowledged_by_new_apis']}; {r['executions_by_old_workers']} / "
        f"{r['executions_by_new_workers']}; {r['acknowledged_during_migration']} / "
        f"{r['executions_during_migration']} |",
        f"| rollout: 5xx / unready samples / released by the old workers / old exits / phase | "
        f"{r['server_errors']} / {r['unready_samples']} / {r['released_by_old_workers']} / "
        f"{exits} / {r['phase_seconds']}s |",
    ]


def _long(jobs: dict[str, float]) -> str:
    return (
        f"{jobs['jobs']:g}: {jobs['completed']:g} / {jobs['cancelled']:g} / "
        f"{jobs['run_once']:g} / {jobs['longest_execution_seconds']:g}s"
    )


def _cancel_lines(c: dict[str, Any]) -> list[str]:
    answers = c["answers"]
    return [
        f"| cancels requested: jobs (HTTP requests) | {c['jobs']} ({c['requests']}) |",
        f"| cancels answered 200 / 202 / 409 / none | {answers.get('200', 0)} / "
        f"{answers.get('202', 0)} / {answers.get('409', 0)} / {answers.get('none', 0)} |",
        f"| cancelled jobs / lost races (202, then completed, failed or dead-lettered) | "
        f"{c['ended_cancelled']} / {c['lost_races']} |",
        f"| running attempts stopped by a cancel, from its request (p50 / max) | "
        f"{_late(c['stop_seconds'])} |",
    ]


def _key_lines(k: dict[str, Any] | None) -> list[str]:
    if not k:
        return []
    return [
        f"| keyed jobs (attempts) / most running of one key at once (limit) | "
        f"{k['keyed_jobs']} ({k['keyed_attempts']}) / {k['max_running']} ({k['limit']}) "
        f"{_pairs(k['max_running_by_key'])} |"
    ]


def _type_lines(limited: dict[str, Any] | None) -> list[str]:
    return [
        f"| {name} attempts / most running at once (TYPE_CONCURRENCY) | "
        f"{t['attempts']} / {t['max_running']} ({t['limit']}) |"
        for name, t in sorted((limited or {}).items())
    ]


def _admin_lines(p: dict[str, Any] | None, b: dict[str, Any] | None, reruns: int) -> list[str]:
    lines = []
    if p:
        lines.append(
            f"| queue pauses (seconds paused) / attempts started within the second / by "
            f"disturbed workers / first start after resume (p50 / max) | {p['pauses']} "
            f"({p['paused_seconds']}s) / {p['started_within_the_limit']} / "
            f"{p['started_by_disturbed_workers']} / "
            f"{_late(p['first_start_after_resume_seconds'])} |"
        )
    if b:
        lines.append(
            f"| bulk cancels (requests): cancelled at once / cancel requested; jobs of the type "
            f"ended cancelled / of / bulk retries (requests): retried | {b['cancel_requests']}: "
            f"{b['cancelled_at_once']} / {b['cancel_requested']}; "
            f"{b['bulk_type_ended_cancelled']} / {b['bulk_type_jobs']} / "
            f"{b['retry_requests']}: {b['retried']} (runs after them: "
            f"{reruns}) |"
        )
    return lines


def _retention_lines(r: dict[str, Any]) -> list[str]:
    return [
        f"| jobs deleted by retention (acknowledged / logged by the workers) | {r['pruned']} "
        f"({r['acknowledged_pruned']} / {r['logged']}) {_pairs(r['by_status'])} |",
        f"| deleted while faults were injected (deleting statements in all) | "
        f"{r['during_faults']} ({r['statements']}) |",
    ]


def _late(spread: dict[str, float]) -> str:
    return f"{spread['p50']}s / {spread['max']}s" if spread else "-"


def _pairs(counts: dict[str, int]) -> str:
    return "(" + ", ".join(f"{k} {v}" for k, v in counts.items()) + ")" if counts else ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--duration", type=float, default=240.0, help="fault phase, seconds")
    parser.add_argument("--json", type=Path, help="write the summary and violations here")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--kinds", default=",".join(faults.KINDS), help="fault kinds to inject")
    parser.add_argument("--keep", action="store_true", help="keep the logs of the run")
    parser.add_argument(
        "--retention",
        type=float,
        default=DEFAULT_RETENTION,
        help="seconds after which the workers delete finished jobs (0: never)",
    )
    parser.add_argument("--no-cancels", action="store_true", help="cancel no job")
    parser.add_argument(
        "--await-prune",
        type=float,
        default=0.0,
        help="after draining, wait up to S seconds for retention's first deletion",
    )
    parser.add_argument(
        "--horizon-seconds",
        type=float,
        default=horizon.DEFAULT_SECONDS,
        help="hold the MVCC horizon this long during the faults, from 20%% into them "
        "(the middle half of a shorter fault phase; 0: never)",
    )
    parser.add_argument(
        "--no-rollout",
        action="store_true",
        help="no rollout phase: the head's services from the start",
    )
    parser.add_argument(
        "--previous",
        default=rollout.PREVIOUS_RELEASE,
        help="the commit whose services the rollout phase starts from "
        f"(default {rollout.PREVIOUS_RELEASE})",
    )
    args = parser.parse_args(argv)
    if args.horizon_seconds < 0:
        parser.error("--horizon-seconds must not be negative")
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(faults.KINDS)
    if unknown:
        parser.error(f"unknown fault kinds: {', '.join(sorted(unknown))}")

    def log(message: str) -> None:
        print(message, flush=True)

    report = run_chaos(
        jobs=args.jobs,
        duration=args.duration,
        seed=seed,
        kinds=kinds,
        log=log,
        keep=args.keep,
        retention=args.retention,
        cancels=not args.no_cancels,
        await_prune=args.await_prune,
        horizon_seconds=args.horizon_seconds,
        previous=None if args.no_rollout else args.previous,
    )
    print(table(report))
    for violation in report.violations[:50]:
        print(f"VIOLATION: {violation}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"summary": report.summary, "violations": report.violations}
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"written to {args.json}")
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
