"""The invariant checker, proven on hand-built runs: each broken guarantee is caught."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tests.chaos.checker import CUT_LISTENER, CUT_MODE, check, recovery_table
from tests.chaos.evidence import (
    HELD_HORIZON,
    HORIZON_TARGET,
    LISTENERS,
    ROWS,
    Ack,
    BulkAction,
    CancelRequest,
    Fault,
    Hold,
    JobRow,
    Pruned,
    QueuePause,
    Rollout,
    ServerError,
)

LEASE = 8.0
T0 = 1_800_000_000.0


def row(job_id: str, status: str, attempts: int = 1, token: int = 1, **kw: Any) -> JobRow:
    defaults: dict[str, Any] = {"type": "chaos-fast", "max_attempts": 3, "idempotency_key": None}
    return JobRow(job_id, status=status, attempts=attempts, lease_token=token, **defaults | kw)


def run(
    job_id: str,
    token: int,
    start: float,
    end: float | None,
    outcome: str | None,
    pid: int = 100,
    type: str = "chaos-fast",
) -> list[dict[str, Any]]:
    """The start (and end) records of one execution, at T0 + seconds."""
    base = {
        "job_id": job_id,
        "type": type,
        "attempt": token,
        "max_attempts": 3,
        "lease_token": token,
        "pid": pid,
    }
    records = [{**base, "event": "start", "t": T0 + start, "outcome": None}]
    if end is not None:
        records.append({**base, "event": "end", "t": T0 + end, "outcome": outcome})
    return records


def stamp(seconds: float) -> str:
    moment = datetime.fromtimestamp(T0 + seconds, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def finished(job_id: str, token: int, at: float, outcome: str) -> dict[str, Any]:
    return {
        "msg": "job finished",
        "job_id": job_id,
        "lease_token": token,
        "outcome": outcome,
        "time": stamp(at),
    }


def lost(job_id: str, token: int, at: float) -> dict[str, Any]:
    return {"msg": "lease lost", "job_id": job_id, "lease_token": token, "time": stamp(at)}


def renew_lost(job_id: str, token: int, at: float) -> dict[str, Any]:
    """The heartbeat's line: the renewal (or the holder's own clock) found the lease lost."""
    return {**lost(job_id, token, at), "operation": "renew"}


def acks(*ids: str) -> list[Ack]:
    return [Ack(f"key-{i}", i, 201) for i in ids]


def paused(pid: int) -> Fault:
    return Fault("pause", "worker-0", T0, T0 + 10, T0 + 11, paused_pids=(pid,))


def checked(rows: list[JobRow], records: list[Any], logs: list[Any], faults: Any = ()) -> Any:
    return check(
        rows, acks(*(r.id for r in rows)), records, logs, list(faults), lease_duration=LEASE
    )


def test_a_clean_run_with_a_retry_has_no_violations() -> None:
    report = checked(
        [row("a", "completed", attempts=2, token=2), row("b", "failed", type="chaos-permanent")],
        [*run("a", 1, 0, 0.1, "error"), *run("a", 2, 1, 1.1, "ok"),
         *run("b", 1, 0, 0.1, "permanent")],
        [finished("a", 1, 0.2, "retried"), finished("a", 2, 1.2, "completed"),
         finished("b", 1, 0.2, "failed")],
    )  # fmt: skip
    assert report.violations == []
    s = report.summary
    assert (s["jobs_submitted"], s["completed"], s["failed"], s["lost"]) == (2, 1, 1, 0)
    assert (s["retries"], s["duplicate_executions"]) == (1, 0)


def test_a_stale_write_that_applied_is_a_violation() -> None:
    # Lease 1 paused past its lease; lease 2 claimed the job; then lease 1 resumed and its
    # complete applied (as it would without the lease-token condition), so lease 2's was lost.
    report = checked(
        [row("a", "completed", attempts=2, token=2)],
        [*run("a", 1, 0, 12.0, "ok", pid=7), *run("a", 2, 10.0, 11.5, "ok", pid=8)],
        [finished("a", 1, 12.01, "completed"), lost("a", 2, 11.6),
         finished("a", 2, 11.6, "completed")],
        [paused(7)],
    )  # fmt: skip
    assert any(v.startswith("stale write applied: job a lease 1") for v in report.violations)
    assert report.summary["stale_writes_applied"] == 1


def test_a_stale_write_rejected_by_its_lease_token_is_counted_not_a_violation() -> None:
    report = checked(
        [row("a", "completed", attempts=2, token=2)],
        [*run("a", 1, 0, 12.0, "ok", pid=7), *run("a", 2, 10.0, 13.0, "ok", pid=8)],
        [lost("a", 1, 12.01), finished("a", 1, 12.01, "completed"),
         finished("a", 2, 13.1, "completed")],
        [paused(7)],
    )  # fmt: skip
    assert report.violations == []
    s = report.summary
    assert (s["stale_writes_rejected"], s["stale_writes_rejected_by_token"]) == (1, 1)
    assert s["duplicate_causes"] == {"paused past lease": 1}
    assert s["duplicates_after_success"] == 1


def test_a_write_rejected_after_the_newer_claim_wrote_is_not_counted_as_fenced_by_token() -> None:
    report = checked(
        [row("a", "completed", attempts=2, token=2)],
        [*run("a", 1, 0, 14.0, "ok", pid=7), *run("a", 2, 10.0, 11.0, "ok", pid=8)],
        [finished("a", 2, 11.1, "completed"), lost("a", 1, 14.1),
         finished("a", 1, 14.1, "completed")],
        [paused(7)],
    )  # fmt: skip
    assert report.violations == []
    s = report.summary
    assert (s["stale_writes_rejected"], s["stale_writes_rejected_by_token"]) == (1, 0)


def test_an_acknowledged_job_missing_or_not_at_rest_is_lost() -> None:
    rows = [row("a", "pending", attempts=0, token=0), row("b", "processing")]
    report = check(rows, acks("a", "b", "c"), [], [], [], lease_duration=LEASE)
    assert report.summary["lost"] == 3
    assert any("job c was acknowledged but is not in the database" in v for v in report.violations)
    assert any("job a was acknowledged but ended pending" in v for v in report.violations)


def test_processing_with_an_expired_lease_is_a_violation() -> None:
    report = checked([row("a", "processing", lease_expired=True)], run("a", 1, 0, None, None), [])
    assert "job a is processing with an expired lease" in report.violations


def test_two_executions_holding_valid_leases_at_once_are_a_violation() -> None:
    report = checked(
        [row("a", "completed", attempts=2, token=2)],
        [*run("a", 1, 0, 5.0, "ok", pid=7), *run("a", 2, 2.0, 2.5, "ok", pid=8)],
        [lost("a", 1, 5.1), finished("a", 1, 5.1, "completed"), finished("a", 2, 2.6, "completed")],
        [paused(7)],
    )  # fmt: skip
    assert any("lease 2 started 3.00s before lease 1 ended" in v for v in report.violations)


def test_an_execution_paused_past_its_lease_does_not_overlap_a_later_claim() -> None:
    # Paused at 0 (its last renewal came then at the latest), re-claimed at 9, resumed at 10:
    # its heartbeat found the lease lost and stopped it.
    report = checked(
        [row("a", "completed", attempts=2, token=2)],
        [*run("a", 1, 0, 10.1, "cancelled", pid=7), *run("a", 2, 9.0, 9.5, "ok", pid=8)],
        [finished("a", 2, 9.6, "completed"), renew_lost("a", 1, 10.05)],
        [paused(7)],
    )  # fmt: skip
    assert report.violations == []
    assert report.summary["paused_holders_stopped_by_renewal"] == 1
    assert report.summary["leases_lost_on_renewal"] == 1


def test_a_paused_holder_whose_successor_logged_its_start_just_after_the_resume_counts() -> None:
    # Re-claimed (committed) before the resume at 10, but the new handler's first record
    # came 0.2 s after it: still a holder superseded during its pause, stopped by renewal.
    report = checked(
        [row("a", "completed", attempts=2, token=2)],
        [*run("a", 1, 0, 10.1, "cancelled", pid=7), *run("a", 2, 10.2, 10.5, "ok", pid=8)],
        [finished("a", 2, 10.6, "completed"), renew_lost("a", 1, 10.05)],
        [paused(7)],
    )  # fmt: skip
    assert report.violations == []
    assert report.summary["paused_holders_stopped_by_renewal"] == 1


def test_a_rerun_without_crash_pause_or_lost_lease_is_unexplained() -> None:
    rows = [row("a", "completed", attempts=2, token=2)]
    records = [*run("a", 1, 0, 0.1, "ok", pid=7), *run("a", 2, 9.0, 9.1, "ok", pid=8)]
    report = checked(rows, records, [finished("a", 2, 9.2, "completed")])
    assert any("re-ran the job after lease 1 without" in v for v in report.violations)
    killed = Fault("kill_child", "worker-0", T0 + 0.15, None, T0 + 2, killed_pids=(7,))
    report = checked(rows, records, [finished("a", 2, 9.2, "completed")], [killed])
    assert report.violations == []
    assert report.summary["duplicate_causes"] == {"crash": 1}


def test_a_job_that_ran_again_after_its_terminal_write_is_a_violation() -> None:
    report = checked(
        [row("a", "completed", attempts=2, token=2)],
        [*run("a", 1, 0, 0.1, "ok"), *run("a", 2, 9.0, 9.1, "ok")],
        [finished("a", 1, 0.2, "completed"), finished("a", 2, 9.2, "completed")],
    )  # fmt: skip
    assert any("ran again (lease 2) after lease 1 wrote completed" in v for v in report.violations)


def test_attempts_beyond_max_attempts_and_early_dead_letters_are_violations() -> None:
    report = checked(
        [row("a", "dead_letter", attempts=2, token=2), row("b", "completed", attempts=4, token=4)],
        [*run("b", 4, 0, 0.1, "ok")],
        [finished("b", 4, 0.2, "completed")],
    )  # fmt: skip
    assert "job a was dead-lettered after 2 of 3 attempts" in report.violations
    assert "job b has 4 attempts of 3" in report.violations
    assert "job b ran attempt 4 of 3" in report.violations


def test_a_completed_job_whose_final_lease_did_not_succeed_is_a_violation() -> None:
    report = checked(
        [row("a", "completed", attempts=2, token=2)],
        [*run("a", 1, 0, 0.1, "error"), *run("a", 2, 1.0, 3.0, "cancelled")],
        [finished("a", 1, 0.2, "retried"), finished("a", 2, 3.1, "retried")],
    )  # fmt: skip
    assert any(
        "job a is completed under lease 2, which had an execution that ended cancelled" in v
        for v in report.violations
    )


def test_one_key_making_two_jobs_is_a_violation() -> None:
    rows = [
        row("a", "completed", idempotency_key="k"),
        row("b", "completed", idempotency_key="k"),
    ]
    records = [*run("a", 1, 0, 0.1, "ok"), *run("b", 1, 0, 0.1, "ok")]
    logs = [finished("a", 1, 0.2, "completed"), finished("b", 1, 0.2, "completed")]
    report = check(
        rows, [Ack("k", "a", 201), Ack("k", "b", 201)], records, logs, [], lease_duration=LEASE
    )
    assert "idempotency key k created 2 jobs" in report.violations
    assert "idempotency key k was acknowledged with 2 different jobs" in report.violations


def test_a_fault_the_system_never_recovered_from_is_a_violation() -> None:
    faults = [
        Fault("kill_child", "worker-0", T0, None, T0 + 2.0),
        Fault("kill_child", "worker-1", T0, None, T0 + 4.0),
        Fault("pg_restart_fast", "postgres", T0, T0 + 1, None),
    ]
    report = check([], [], [], [], faults, lease_duration=LEASE)
    assert report.violations == ["no recovery after fault pg_restart_fast on postgres"]
    assert recovery_table(faults) == {"kill_child": {"p50": 3.0, "max": 4.0}}


def test_a_job_dead_lettered_without_any_execution_never_ran_and_is_a_violation() -> None:
    report = checked(
        [row("a", "dead_letter", attempts=3, token=3), row("b", "dead_letter", attempts=3)],
        [*run("b", 1, 0, None, None)],
        [],
        [Fault("kill_child", "worker-0", T0 + 0.1, None, T0 + 2, killed_pids=(100,))],
    )
    assert report.summary["never_ran"] == 1
    assert "job a ended dead_letter after 3 attempts, none ran" in report.violations
    assert not any("job b ended" in v for v in report.violations)


def abandoned(job_id: str, token: int, at: float) -> dict[str, Any]:
    return {
        "msg": "handler thread abandoned",
        "job_id": job_id,
        "lease_token": token,
        "time": stamp(at),
    }


def test_a_thread_returning_after_its_attempt_was_recorded_overlaps_nothing() -> None:
    # Two attempts of a plain handler, each timed out at 2 s, abandoned, its thread
    # returning 4 s later, after the next attempt had started.
    rows = [row("a", "dead_letter", attempts=2, token=2, max_attempts=2)]
    records = [*run("a", 1, 0, 6.0, "ok", pid=7), *run("a", 2, 2.5, 8.5, "ok", pid=8)]
    finishing = [finished("a", 1, 2.01, "retried"), finished("a", 2, 4.51, "dead_letter")]
    for record in records:
        record["max_attempts"] = 2
    blind = checked(rows, records, finishing)
    assert any("stale write applied" in v for v in blind.violations)
    assert any("lease 2 started" in v for v in blind.violations)
    told = checked(rows, records, [abandoned("a", 1, 2.0), abandoned("a", 2, 4.5), *finishing])
    assert told.violations == []
    assert told.summary["retries"] == 1


def scheduled_ack(job_id: str, due: float, status: int = 201) -> Ack:
    return Ack(f"key-{job_id}", job_id, status, T0 + due, scheduled=True)


def test_an_execution_started_before_its_job_was_due_is_a_violation() -> None:
    rows = [row("early", "completed"), row("on-time", "completed"), row("margin", "completed")]
    report = check(
        rows,
        [scheduled_ack("early", 5.0), scheduled_ack("on-time", 5.0), scheduled_ack("margin", 5.0)],
        [*run("early", 1, 4.9, 5.0, "ok"), *run("on-time", 1, 5.2, 5.3, "ok"),
         *run("margin", 1, 4.999, 5.1, "ok")],
        [finished("early", 1, 5.1, "completed"), finished("on-time", 1, 5.4, "completed"),
         finished("margin", 1, 5.2, "completed")],
        [],
        lease_duration=LEASE,
    )  # fmt: skip
    assert len(report.violations) == 1
    assert "job early: lease 1 started 100.0 ms before the job was due" in report.violations[0]
    s = report.summary
    assert (s["started_before_due"], s["scheduled_jobs"]) == (1, 3)
    assert s["scheduled_lateness_seconds"] == {"p50": -0.001, "max": 0.2}


def test_every_execution_of_a_job_is_held_to_its_due_time_not_only_the_first() -> None:
    report = checked_with(
        [row("a", "completed", attempts=2, token=2)],
        [scheduled_ack("a", 2.0, status=200)],
        [*run("a", 1, 2.5, 2.6, "error"), *run("a", 2, 1.0, 1.1, "ok")],
    )
    assert report.summary["started_before_due"] == 1
    assert "job a: lease 2 started 1000.0 ms before the job was due" in report.violations


def test_jobs_are_counted_by_queue() -> None:
    report = checked(
        [row("a", "completed", queue="bulk"), row("b", "completed"), row("c", "completed")],
        [*run("a", 1, 0, 0.1, "ok"), *run("b", 1, 0, 0.1, "ok"), *run("c", 1, 0, 0.1, "ok")],
        [finished(i, 1, 0.2, "completed") for i in "abc"],
    )
    assert report.violations == []
    assert report.summary["jobs_by_queue"] == {"bulk": 1, "default": 2}
    assert report.summary["scheduled_lateness_seconds"] == {}


def checked_with(rows: list[JobRow], acks_: list[Ack], records: list[Any]) -> Any:
    return check(rows, acks_, records, [], [], lease_duration=LEASE)


# --- heartbeats: a running holder keeps its lease for as long as its attempt runs ----------


def long_run(
    job_id: str, token: int, start: float, end: float | None, outcome: str | None, pid: int
) -> list[dict[str, Any]]:
    return [{**r, "type": "chaos-long"} for r in run(job_id, token, start, end, outcome, pid)]


def long_row(status: str = "completed", attempts: int = 1, token: int = 1) -> JobRow:
    return row("long", status, attempts=attempts, token=token, type="chaos-long")


def test_a_long_job_run_once_by_an_undisturbed_holder_is_clean() -> None:
    report = checked(
        [long_row()], long_run("long", 1, 0, 20.0, "ok", pid=7),
        [finished("long", 1, 20.1, "completed")],
    )  # fmt: skip
    assert report.violations == []
    assert report.summary["long_jobs"] == {
        "jobs": 1,
        "completed": 1,
        "cancelled": 0,
        "run_once": 1,
        "longest_execution_seconds": 20.0,
    }


def test_a_second_execution_while_an_undisturbed_holder_still_runs_is_a_violation() -> None:
    # Lease 1 ran on well past LEASE (8 s) under its heartbeats; at 10 s lease 2 claimed the
    # job anyway: the lease was lost while its holder was alive, running and renewing.
    report = checked(
        [long_row(attempts=2, token=2)],
        [*long_run("long", 1, 0, 12.6, "cancelled", pid=7),
         *long_run("long", 2, 10.0, 25.0, "ok", pid=8)],
        [renew_lost("long", 1, 12.5), finished("long", 2, 25.1, "completed")],
    )  # fmt: skip
    assert "job long: lease 2 started 2.60s before lease 1 ended or expired" in report.violations
    assert (
        "job long: lease 1 was lost while its holder (pid 7) ran undisturbed, "
        "and lease 2 re-ran it" in report.violations
    )


def test_a_lease_lost_without_a_fault_on_its_holder_is_a_violation_even_without_overlap() -> None:
    rows = [long_row(attempts=2, token=2)]
    records = [*long_run("long", 1, 0, 9.0, "cancelled", pid=7),
               *long_run("long", 2, 10.0, 22.0, "ok", pid=8)]  # fmt: skip
    logs = [renew_lost("long", 1, 8.95), finished("long", 2, 22.1, "completed")]
    undisturbed = checked(rows, records, logs)
    assert undisturbed.violations == [
        "job long: lease 1 was lost while its holder (pid 7) ran undisturbed, and lease 2 re-ran it"
    ]
    # A fault on another process explains nothing.
    elsewhere = Fault(
        "proxy_blackhole", "worker-1", T0 + 2, T0 + 8, T0 + 9, partitioned_pids=(9, 10)
    )
    assert checked(rows, records, logs, [elsewhere]).violations == undisturbed.violations
    # Cut off from the database, or the database itself down: the loss is explained.
    for fault in (
        Fault("proxy_blackhole", "worker-0", T0 + 2, T0 + 8, T0 + 9, partitioned_pids=(6, 7)),
        Fault("pg_restart_immediate", "postgres", T0 + 3, T0 + 6, T0 + 7),
    ):
        report = checked(rows, records, logs, [fault])
        assert report.violations == [], fault.kind
        assert report.summary["duplicate_causes"] == {"lease lost in a fault": 1}


def held_horizon(**kw: Any) -> Fault:
    """A held_horizon fault from T0 to T0 + 60 (the fault phase began at T0 - 24)."""
    fields: dict[str, Any] = {
        "idle_xids": (700, 760), "reader_xmins": (698, 761), "reconnects": (T0 + 30, T0 + 31),
        "held_seconds": 57.5, "max_age": 9000, "dead_tuples": (150, 4000, 31000), "reads": 58,
    }  # fmt: skip
    hold = Hold(T0 - 24, T0, T0 + 60, 60.0, **fields | kw)
    return Fault(HELD_HORIZON, HORIZON_TARGET, T0, T0 + 60, T0 + 60.1, note=hold.note, hold=hold)


def test_a_held_horizon_is_a_fault_and_its_hold_is_summarized() -> None:
    report = check([], [], [], [], [held_horizon()], lease_duration=LEASE)
    assert report.violations == []
    assert report.summary["faults_injected"] == {"held_horizon": 1}
    assert report.summary["recovery_seconds"] == {"held_horizon": {"p50": 0.1, "max": 0.1}}
    assert report.summary["held_horizon"] == [
        {
            "from_seconds": 24.0, "to_seconds": 84.0, "planned_seconds": 60.0,
            "held_seconds": 57.5, "reconnects": 2, "idle_xids": [700, 760],
            "reader_xmins": [698, 761], "max_age": 9000, "dead_tuples_first": 150,
            "dead_tuples_max": 31000, "dead_tuples_samples": [150, 4000, 31000], "reads": 58,
        }
    ]  # fmt: skip


def test_a_horizon_that_was_never_held_is_a_violation() -> None:
    never = held_horizon(idle_xids=(), reader_xmins=(), held_seconds=0.0, dead_tuples=())
    assert check([], [], [], [], [never], lease_duration=LEASE).violations == [
        "held_horizon: the idle transaction never held an xid (backend_xid)",
        "held_horizon: the repeatable-read reader never held a backend_xmin",
    ]
    no_reader = held_horizon(reader_xmins=(), held_seconds=0.0)
    assert check([], [], [], [], [no_reader], lease_duration=LEASE).violations == [
        "held_horizon: the repeatable-read reader never held a backend_xmin"
    ]
    apart = held_horizon(held_seconds=0.0)
    assert check([], [], [], [], [apart], lease_duration=LEASE).violations == [
        "held_horizon: its two sessions never held the horizon at once"
    ]
    unrecorded = Fault(HELD_HORIZON, HORIZON_TARGET, T0, T0 + 60, T0 + 61)
    assert check([], [], [], [], [unrecorded], lease_duration=LEASE).violations == [
        "held_horizon: no record of the hold"
    ]


def test_a_held_horizon_explains_no_lease_lost_while_it_was_held() -> None:
    # It touches no process of the system: a lease lost during it is still unexplained.
    rows = [long_row(attempts=2, token=2)]
    records = [*long_run("long", 1, 0, 9.0, "cancelled", pid=7),
               *long_run("long", 2, 10.0, 22.0, "ok", pid=8)]  # fmt: skip
    logs = [renew_lost("long", 1, 8.95), finished("long", 2, 22.1, "completed")]
    assert checked(rows, records, logs, [held_horizon()]).violations == [
        "job long: lease 1 was lost while its holder (pid 7) ran undisturbed, and lease 2 re-ran it"
    ]


def test_a_killed_holder_keeps_its_lease_until_the_kill_plus_the_lease_less_a_renewal() -> None:
    # Killed at 5 s: its last renewal came at 5 - 8/3 s at the earliest, so its lease held
    # until 10.33 s at least. A claim at 8 s came too early; one at 11 s did not.
    def killed_at_5(second_start: float) -> Any:
        return checked(
            [row("a", "completed", attempts=2, token=2)],
            [*run("a", 1, 0, None, None, pid=7), *run("a", 2, second_start, 12.0, "ok", pid=8)],
            [finished("a", 2, 12.1, "completed")],
            [Fault("kill_child", "worker-0", T0 + 4, None, T0 + 6, killed_pids=(7,),
                   stopped_at=T0 + 5)],
        )  # fmt: skip

    assert killed_at_5(8.0).violations == [
        "job a: lease 2 started 2.33s before lease 1 ended or expired"
    ]
    assert killed_at_5(11.0).violations == []


def test_a_paused_holder_that_runs_on_after_its_resume_is_a_violation() -> None:
    # Resumed at 10 s after lease 2 had claimed the job, lease 1's handler ran on to 20 s:
    # no renewal stopped it (its write was rejected, but the handler's side effects were not).
    report = checked(
        [long_row(attempts=2, token=2)],
        [*long_run("long", 1, 0, 20.0, "ok", pid=7),
         *long_run("long", 2, 9.0, 21.0, "ok", pid=8)],
        [lost("long", 1, 20.1), finished("long", 1, 20.1, "completed"),
         finished("long", 2, 21.1, "completed")],
        [paused(7)],
    )  # fmt: skip
    assert report.violations == [
        "job long: lease 1's holder (pid 7) ran on 10.0s after it was resumed past its lease"
    ]
    assert report.summary["paused_holders_stopped_by_renewal"] == 0


def test_a_paused_holder_whose_job_nobody_claimed_meanwhile_may_run_on() -> None:
    # Claimed just before the pause, its lease outlived the pause; resumed, it renewed it.
    report = checked(
        [long_row()], long_run("long", 1, -0.5, 20.0, "ok", pid=7),
        [finished("long", 1, 20.1, "completed")], [paused(7)],
    )  # fmt: skip
    assert report.violations == []


def test_a_renewal_that_raced_its_own_outcome_write_is_no_lost_lease() -> None:
    # The heartbeat took the lease, the completion committed, the renewal then matched no row.
    report = checked(
        [row("a", "completed")], run("a", 1, 0, 0.4, "ok"),
        [finished("a", 1, 0.45, "completed"), renew_lost("a", 1, 0.46)],
    )  # fmt: skip
    assert report.violations == []
    assert report.summary["leases_lost_on_renewal"] == 0
    assert report.summary["renewals_lost_to_their_own_outcome_write"] == 1


# --- cancels: every answer to POST /jobs/{id}/cancel is kept -------------------------------


def cancel(
    job_id: str, sent: float, answered: float | None, code: int | None, attempts: int = 0
) -> CancelRequest:
    return CancelRequest(
        job_id, T0 + sent, None if answered is None else T0 + answered, code, attempts, "race"
    )


def with_cancels(
    rows: list[JobRow],
    records: list[Any],
    logs: list[Any],
    cancels: list[CancelRequest],
    faults: Any = (),
) -> Any:
    return check(
        rows,
        acks(*(r.id for r in rows)),
        records,
        logs,
        list(faults),
        lease_duration=LEASE,
        cancels=cancels,
    )


def ended(at: float) -> float:
    return T0 + at


def test_cancels_of_a_pending_a_running_and_a_finished_job_that_are_kept_are_clean() -> None:
    report = with_cancels(
        [row("p", "cancelled", attempts=0, token=0, finished_at=ended(1.01)),
         row("r", "cancelled", finished_at=ended(3.3)),
         row("c", "completed")],
        [*run("r", 1, 0, 3.3, "cancelled"), *run("c", 1, 0, 1.0, "ok")],
        [finished("r", 1, 3.31, "cancelled"), finished("c", 1, 1.01, "completed")],
        [cancel("p", 1.0, 1.02, 200), cancel("r", 3.0, 3.05, 202, attempts=1),
         cancel("c", 4.9, None, None), cancel("c", 5.0, 5.01, 409)],
    )  # fmt: skip
    assert report.violations == []
    s = report.summary
    assert s["cancelled"] == 2
    assert s["cancels"] | {"by_mode": None} == {
        "jobs": 3,
        "requests": 4,
        "answers": {"200": 1, "202": 1, "409": 1},
        "by_mode": None,
        "ended_cancelled": 2,
        "lost_races": 0,
        "stop_seconds": {"p50": 0.3, "max": 0.3},
        "stop_seconds_by_mode": {"race": {"p50": 0.3, "max": 0.3}},
        "stale_starts_after_cancel": 0,
    }


def test_a_job_claimed_again_after_its_cancel_was_answered_is_a_violation() -> None:
    # Cancelled at once (200, at attempt 0), then claimed: attempt 1 started at 2 s.
    # Asked while running (202, at attempt 1), then claimed again: attempt 2.
    report = with_cancels(
        [row("p", "cancelled", finished_at=ended(2.5)),
         row("r", "cancelled", attempts=2, token=2, finished_at=ended(6.0))],
        [*run("p", 1, 2.0, 2.5, "ok"),
         *run("r", 1, 0, 1.2, "cancelled"), *run("r", 2, 5.0, 6.0, "cancelled")],
        [finished("r", 1, 1.21, "cancelled")],
        [cancel("p", 1.0, 1.02, 200), cancel("r", 1.0, 1.05, 202, attempts=1)],
    )  # fmt: skip
    assert "job p: attempt 1 (lease 1) was claimed after a cancel answered 200 at attempt 0" in (
        report.violations
    )
    assert "job r: attempt 2 (lease 2) was claimed after a cancel answered 202 at attempt 1" in (
        report.violations
    )


def test_an_attempt_of_an_earlier_claim_may_start_after_a_200_only_on_a_disturbed_holder() -> None:
    # Claimed before the cancel, its holder paused before the handler started; the job went
    # back to pending, was cancelled (200 at attempt 1), and only then did the handler start.
    rows = [row("p", "cancelled", finished_at=ended(10.0))]
    records = run("p", 1, 10.5, 10.6, "ok", pid=7)
    cancels = [cancel("p", 10.0, 10.02, 200, attempts=1)]
    undisturbed = with_cancels(rows, records, [], cancels)
    assert undisturbed.violations == [
        "job p: lease 1 started 0.48s after the job was cancelled (200)"
    ]
    report = with_cancels(rows, records, [], cancels, [paused(7)])
    assert report.violations == []
    assert report.summary["cancels"]["stale_starts_after_cancel"] == 1


def test_a_job_cancelled_at_once_while_its_undisturbed_handler_ran_is_a_violation() -> None:
    # A 200 says no worker held the job; an attempt running on past it contradicts that,
    # unless a fault had cost its holder the lease (the job went back to pending meanwhile).
    rows = [row("a", "cancelled", finished_at=ended(2.0))]
    records = run("a", 1, 0, 5.0, "cancelled", pid=7)
    cancels = [cancel("a", 2.0, 2.02, 200, attempts=1)]
    assert with_cancels(rows, records, [], cancels).violations == [
        "job a was cancelled at once (200) while lease 1's handler (pid 7) still ran"
    ]
    assert with_cancels(rows, records, [], cancels, [paused(7)]).violations == []
    done_before = run("a", 1, 0, 1.5, "error", pid=7)
    assert with_cancels(rows, done_before, [], cancels).violations == []


def test_a_job_asked_to_cancel_while_running_ends_cancelled_or_as_the_race_winner() -> None:
    report = with_cancels(
        [row("won", "completed"), row("stuck", "processing")],
        [*run("won", 1, 0, 1.1, "ok"), *run("stuck", 1, 0, 1.1, "cancelled")],
        [finished("won", 1, 1.11, "completed")],
        [cancel("won", 1.0, 1.05, 202, attempts=1), cancel("stuck", 1.0, 1.05, 202, attempts=1)],
    )  # fmt: skip
    assert "cancel of job stuck answered 202, but the job ended processing" in report.violations
    assert not any("job won" in v for v in report.violations)
    assert report.summary["cancels"]["lost_races"] == 1
    assert report.summary["lost"] == 1


def test_a_handler_running_on_after_its_202_is_a_violation_unless_a_fault_hit_its_holder() -> None:
    # Limit: a renewal interval (8/3 s) plus the margin (2 s) after the answer.
    rows = [long_row("cancelled")]
    records = long_run("long", 1, 0, 12.0, "cancelled", pid=7)
    logs = [finished("long", 1, 12.01, "cancelled")]
    cancels = [cancel("long", 2.0, 2.05, 202, attempts=1)]
    assert with_cancels(rows, records, logs, cancels).violations == [
        "job long: lease 1's handler (pid 7) ran on 9.95s after its cancel was answered 202"
    ]
    cut_off = Fault("proxy_blackhole", "worker-0", T0 + 3, T0 + 9, T0 + 10, partitioned_pids=(7,))
    assert with_cancels(rows, records, logs, cancels, [cut_off]).violations == []
    in_time = long_run("long", 1, 0, 6.5, "cancelled", pid=7)
    assert with_cancels(rows, in_time, logs, cancels).violations == []
    # A fault long over by the time the cancel was asked excuses nothing.
    later = [cancel("long", 11.0, 11.05, 202, attempts=1)]
    long_over = Fault("pg_restart_fast", "postgres", T0 + 1, T0 + 2, T0 + 3)
    ran_long = long_run("long", 1, 0, 25.0, "cancelled", pid=7)
    assert with_cancels(rows, ran_long, logs, later, [long_over]).violations == [
        "job long: lease 1's handler (pid 7) ran on 13.95s after its cancel was answered 202"
    ]


def test_a_job_ending_cancelled_although_its_undisturbed_holder_returned_is_a_violation() -> None:
    rows = [row("a", "cancelled", finished_at=ended(3.1))]
    records = run("a", 1, 0, 3.0, "ok", pid=7)
    cancels = [cancel("a", 2.0, 2.05, 202, attempts=1)]
    assert with_cancels(rows, records, [], cancels).violations == [
        "job a ended cancelled, but lease 1's handler returned ok to its undisturbed holder (pid 7)"
    ]
    # Its holder paused past the lease: the write was lost, recovery ended the job cancelled.
    assert with_cancels(rows, records, [], cancels, [paused(7)]).violations == []
    # It failed on its own: the retry became the cancel.
    failed = run("a", 1, 0, 3.0, "error", pid=7)
    assert with_cancels(rows, failed, [], cancels).violations == []
    # A fault more than a lease before it returned does not explain a lost write.
    late = [row("a", "cancelled", finished_at=ended(30.1))]
    ran = run("a", 1, 0, 30.0, "ok", pid=7)
    over = Fault("pg_restart_fast", "postgres", T0 + 1, T0 + 2, T0 + 3)
    asked = [cancel("a", 29.0, 29.05, 202, attempts=1)]
    assert with_cancels(late, ran, [], asked, [over]).violations == [
        "job a ended cancelled, but lease 1's handler returned ok to its undisturbed holder (pid 7)"
    ]


def test_a_job_cancelled_without_being_asked_or_after_another_outcome_is_a_violation() -> None:
    report = with_cancels(
        [row("a", "cancelled", attempts=0, token=0, finished_at=ended(1.0)),
         row("b", "cancelled", attempts=0, token=0, finished_at=ended(1.0)),
         row("c", "cancelled", finished_at=ended(2.0))],
        [*run("c", 1, 0, 0.5, "ok")],
        [finished("c", 1, 0.51, "completed")],
        [cancel("b", 1.5, 1.52, 409), cancel("c", 1.9, 1.95, 409)],
    )  # fmt: skip
    assert [v.split(" (")[0] for v in report.violations] == [
        "job a ended cancelled, but no cancel was asked before it finished",
        "job b ended cancelled, but no cancel was asked before it finished",
        "job c ended cancelled after lease 1 wrote completed",
    ]
    # With what the run knew of the job: when it finished, the cancels asked, its writes.
    assert report.violations[1].endswith(
        f"(type chaos-fast, queue default, attempt 0, finished at {ended(1.0):.3f}; "
        f"cancels asked at {ended(1.5):.3f}; writes: none)"
    )


def test_a_dead_letter_cancelled_by_a_cancel_asked_after_it_died_is_no_violation() -> None:
    rows = [row("a", "cancelled", attempts=1, max_attempts=1, finished_at=ended(2.0)),
            row("b", "cancelled", attempts=1, max_attempts=1, finished_at=ended(2.0))]  # fmt: skip
    records = [
        {**r, "max_attempts": 1}
        for r in [*run("a", 1, 0, 0.5, "error"), *run("b", 1, 0, 0.5, "error")]
    ]
    logs = [finished("a", 1, 0.51, "dead_letter"), finished("b", 1, 0.51, "dead_letter")]
    report = with_cancels(
        rows, records, logs, [cancel("a", 1.9, 1.95, 200), cancel("b", 0.2, 0.25, 202)]
    )
    # b's cancel came before it died: the dead letter won that race, and b ended cancelled all
    # the same.
    assert report.violations == ["job b ended cancelled after lease 1 wrote dead_letter"]


def test_a_409_for_a_job_that_could_still_be_cancelled_is_a_violation() -> None:
    rows = [row("a", "dead_letter", attempts=1, max_attempts=1)]
    records = [{**r, "max_attempts": 1} for r in run("a", 1, 0, 0.5, "error")]
    logs = [finished("a", 1, 0.51, "dead_letter")]
    report = with_cancels(rows, records, logs, [cancel("a", 1.0, 1.01, 409)])
    assert report.violations == ["cancel of job a answered 409, but the job ended dead_letter"]


def test_a_404_is_right_only_for_a_job_retention_deleted_before_the_answer() -> None:
    done = row("a", "completed", finished_at=ended(0.5))
    records = run("a", 1, 0, 0.5, "ok")
    logs = [finished("a", 1, 0.51, "completed")]
    asked = [cancel("a", 100.0, 100.01, 404)]
    report = with_cancels([done], records, logs, asked)
    assert report.violations == ["cancel of job a answered 404 while the job existed"]
    gone = Pruned(done, T0 + 50.0, "jobqueue-worker")
    report = check(
        [], acks("a"), records, logs, [], lease_duration=LEASE, cancels=asked,
        pruned=[gone], retention={"completed": 30.0},
    )  # fmt: skip
    assert report.violations == []


# --- retention: a missing job is accounted for only by a legitimate deletion ----------------


def pruned_row(job: JobRow, at: float, by: str = "jobqueue-worker") -> Pruned:
    return Pruned(job, T0 + at, by)


def with_pruned(
    rows: list[JobRow], acked: list[str], records: list[Any], logs: list[Any], pruned: Any
) -> Any:
    return check(
        rows,
        acks(*acked),
        records,
        logs,
        [],
        lease_duration=LEASE,
        pruned=list(pruned),
        retention={"completed": 30.0, "failed": 30.0, "cancelled": 30.0, "dead_letter": 0.0},
    )


def pruned_line(total: int) -> dict[str, Any]:
    return {"msg": "jobs pruned", "total": total, "time": stamp(40.0)}


def test_a_job_deleted_by_retention_once_old_enough_is_accounted_for_not_lost() -> None:
    report = with_pruned(
        [row("b", "completed")],
        ["a", "b"],
        [*run("a", 1, 0, 0.5, "ok"), *run("b", 1, 0, 0.5, "ok")],
        [finished("a", 1, 0.51, "completed"), finished("b", 1, 0.51, "completed"),
         pruned_line(1)],
        [pruned_row(row("a", "completed", finished_at=ended(0.51)), 40.0)],
    )  # fmt: skip
    assert report.violations == []
    s = report.summary
    assert (s["lost"], s["completed"]) == (0, 2)
    assert s["retention"] | {"ages_seconds": None} == {
        "pruned": 1,
        "by_status": {"completed": 1},
        "logged": 1,
        "statements": 1,
        "during_faults": 0,
        "acknowledged_pruned": 1,
        "ages_seconds": None,
    }


def test_a_missing_job_that_was_not_deleted_finished_is_lost() -> None:
    report = with_pruned(
        [],
        ["a", "b"],
        run("b", 1, 0, None, None),
        [],
        [pruned_row(row("b", "processing"), 40.0)],
    )
    assert report.summary["lost"] == 2
    assert "job a was acknowledged but is not in the database" in report.violations
    assert "job b was acknowledged but is not in the database" in report.violations
    assert "job b was deleted while processing, by jobqueue-worker" in report.violations


def test_a_deletion_too_young_of_a_kept_status_or_not_by_a_worker_is_a_violation() -> None:
    young = row("a", "completed", finished_at=ended(1.0))
    other = row("b", "failed", type="chaos-permanent", finished_at=ended(1.0))
    kept = row("c", "dead_letter", attempts=3, token=3, finished_at=ended(1.0))
    report = with_pruned(
        [],
        ["a", "b", "c"],
        [*run("a", 1, 0, 0.5, "ok"), *run("b", 1, 0, 0.5, "permanent"),
         *run("c", 1, 0, 0.1, "error"), *run("c", 2, 0.2, 0.3, "error"),
         *run("c", 3, 0.4, 0.5, "error")],
        [finished("a", 1, 0.51, "completed"), finished("b", 1, 0.51, "failed"),
         finished("c", 1, 0.11, "retried"), finished("c", 2, 0.31, "retried"),
         finished("c", 3, 0.51, "dead_letter")],
        [pruned_row(young, 20.0), pruned_row(other, 40.0, by="psql"), pruned_row(kept, 40.0)],
    )  # fmt: skip
    assert report.violations == [
        "job a was deleted 19.000s after it finished completed, before its retention of 30s",
        "job b (failed) was deleted by 'psql', not a worker",
        "job c was deleted dead_letter though that status is kept",
    ]
    assert report.summary["lost"] == 0


def test_workers_counting_more_deletions_than_were_made_is_a_violation() -> None:
    report = with_pruned(
        [],
        ["a"],
        run("a", 1, 0, 0.5, "ok"),
        [finished("a", 1, 0.51, "completed"), pruned_line(2)],
        [pruned_row(row("a", "completed", finished_at=ended(0.51)), 40.0)],
    )
    assert report.violations == ["the workers logged 2 jobs pruned, but 1 were deleted"]


def test_a_deleted_row_stands_for_the_final_row_in_every_other_check() -> None:
    # Deleted completed, but the execution of its final lease failed: as for a row in the table.
    report = with_pruned(
        [],
        ["a"],
        run("a", 1, 0, 0.5, "error"),
        [finished("a", 1, 0.51, "retried")],
        [pruned_row(row("a", "completed", finished_at=ended(0.51)), 40.0)],
    )
    assert report.violations == [
        "job a is completed under lease 1, which had an execution that ended error"
    ]


def test_deletions_are_counted_by_statement_and_those_made_while_faults_went_on() -> None:
    jobs = [row(i, "completed", finished_at=ended(0.5)) for i in "abc"]
    report = check(
        [],
        acks("a", "b", "c"),
        [r for i in "abc" for r in run(i, 1, 0, 0.4, "ok")],
        [finished(i, 1, 0.5, "completed") for i in "abc"],
        [Fault("pg_restart_fast", "postgres", T0 + 50, T0 + 55, T0 + 56)],
        lease_duration=LEASE,
        pruned=[pruned_row(jobs[0], 40.0), pruned_row(jobs[1], 40.0), pruned_row(jobs[2], 70.0)],
        retention={"completed": 30.0},
    )
    assert report.violations == []
    assert (
        report.summary["retention"]["statements"],
        report.summary["retention"]["during_faults"],
    ) == (2, 2)


# --- locked rows: only the holder of a locked job is disturbed, and only as its holder -----


def locked(
    *job_ids: str, since: float = 2.0, until: float = 10.0, kind: str = "lock_rows"
) -> Fault:
    """Rows of `job_ids` locked from T0 + since to T0 + until (psql, or an enqueue replay)."""
    return Fault(
        kind, ROWS, T0 + since, T0 + until, T0 + until + 0.2, note="locked",
        stopped_at=T0 + since, locked_jobs=job_ids,
        detail={"via": "psql", "asked": len(job_ids), "seen_locked": len(job_ids), "bystanders": 1},
    )  # fmt: skip


def two_long_jobs_of_one_process() -> tuple[list[JobRow], list[Any], list[Any]]:
    """`held` and `free`, both run by pid 7 from 0 s: each lost its lease on renewal at
    5.9 s (as one renewal statement stuck behind a lock on one of them would make it),
    and each ran again on pid 8 from 10.5 s."""
    rows = [row(j, "completed", attempts=2, token=2, type="chaos-long") for j in ("held", "free")]
    records = [
        r
        for j in ("held", "free")
        for r in [*long_run(j, 1, 0, 5.9, "cancelled", pid=7),
                  *long_run(j, 2, 10.5, 20.0, "ok", pid=8)]
    ]  # fmt: skip
    logs = [
        e
        for j in ("held", "free")
        for e in (renew_lost(j, 1, 5.9), finished(j, 2, 20.1, "completed"))
    ]
    return rows, records, logs


def test_a_locked_row_explains_the_lost_lease_of_its_own_job_and_no_other() -> None:
    rows, records, logs = two_long_jobs_of_one_process()
    for kind in ("lock_rows", "lock_enqueue"):
        report = checked(rows, records, logs, [locked("held", kind=kind)])
        assert report.violations == [
            "job free: lease 1 was lost while its holder (pid 7) ran undisturbed, "
            "and lease 2 re-ran it"
        ], kind
        s = report.summary
        assert s["duplicate_causes"] == {"lease lost in a fault": 1}
        assert s["leases_lost_undisturbed"] == 1
        assert s["locked_rows"] == [
            {
                "kind": kind, "via": "psql", "jobs_taken": 1, "jobs_locked": 1, "seen_locked": 1,
                "jobs_free": 1, "held_seconds": 8.0, "leases_lost_locked": 1,
                "leases_lost_free": 1,
            }
        ]  # fmt: skip
    # Both rows locked: both losses explained.
    assert checked(rows, records, logs, [locked("held", "free")]).violations == []
    # A lock that ended before the attempt began explains nothing.
    early = locked("held", "free", since=-20.0, until=-12.0)
    assert len(checked(rows, records, logs, [early]).violations) == 2


def test_a_locked_job_s_holder_may_lose_the_lease_a_lease_after_the_lock_began() -> None:
    # Its renewals stuck from 2 s: its lease is sure only until 2 + 8 - 8/3 s, so a re-run
    # from 7 s overlaps nothing; had another row been locked, it held the lease until 7.9 s.
    rows = [row("held", "completed", attempts=2, token=2, type="chaos-long")]
    records = [*long_run("held", 1, 0, 7.9, "cancelled", pid=7),
               *long_run("held", 2, 7.0, 20.0, "ok", pid=8)]  # fmt: skip
    logs = [renew_lost("held", 1, 7.9), finished("held", 2, 20.1, "completed")]
    assert checked(rows, records, logs, [locked("held")]).violations == []
    assert checked(rows, records, logs, [locked("other")]).violations == [
        "job held: lease 2 started 0.90s before lease 1 ended or expired",
        "job held: lease 1 was lost while its holder (pid 7) ran undisturbed, "
        "and lease 2 re-ran it",
    ]


def test_a_lease_lost_undisturbed_is_a_violation_even_if_the_job_never_ran_again() -> None:
    # Its heartbeat lost the lease; then the job was cancelled (a recovery of a cancel
    # request), so nothing re-ran it: the loss is still a violation.
    rows = [long_row("cancelled")]
    records = long_run("long", 1, 0, 6.0, "cancelled", pid=7)
    logs = [renew_lost("long", 1, 6.0)]
    cancels = [cancel("long", 5.5, 5.55, 202, attempts=1)]
    assert with_cancels(rows, records, logs, cancels).violations == [
        "job long: lease 1 was lost while its holder (pid 7) ran undisturbed"
    ]
    assert with_cancels(rows, records, logs, cancels, [locked("long")]).violations == []
    # An outcome write that matched no row, from an undisturbed holder, is as much a loss.
    wrote = [lost("long", 1, 6.0), finished("long", 1, 6.0, "completed")]
    report = with_cancels(rows, long_run("long", 1, 0, 6.0, "ok", pid=7), wrote, cancels)
    assert "job long: lease 1 was lost while its holder (pid 7) ran undisturbed" in (
        report.violations
    )


def test_a_cancel_of_a_locked_job_may_stop_late_but_one_of_a_free_job_may_not() -> None:
    # The cancel's renewal waits behind the lock: only the locked job's holder is excused.
    rows = [long_row("cancelled")]
    records = long_run("long", 1, 0, 9.5, "cancelled", pid=7)
    logs = [finished("long", 1, 9.6, "cancelled")]
    cancels = [cancel("long", 3.0, 3.05, 202, attempts=1)]
    assert with_cancels(rows, records, logs, cancels, [locked("long")]).violations == []
    assert with_cancels(rows, records, logs, cancels, [locked("other")]).violations == [
        "job long: lease 1's handler (pid 7) ran on 6.45s after its cancel was answered 202"
    ]


# --- cut listeners: cancels in flight still stop their jobs in time ------------------------


def cut(
    jobs: tuple[str, ...] = ("p1", "p2", "p3"), terminated: int = 6, back: float | None = 3.0
) -> Fault:
    """The workers' listeners cut at T0 + 2, all back at T0 + back; p3 asked once back."""
    detail = {
        "terminated": terminated, "listeners_before": 6, "cut_at": T0 + 2,
        "back_at": None if back is None else T0 + back, "jobs": list(jobs),
        "after_back": ["p3"],
    }  # fmt: skip
    healed = T0 + (back if back is not None else 30)
    return Fault(
        CUT_LISTENER, LISTENERS, T0 + 2, healed, healed + 0.1, stopped_at=T0 + 2, detail=detail
    )


def cut_cancel(job_id: str, sent: float, answered: float, code: int = 202) -> CancelRequest:
    return CancelRequest(job_id, T0 + sent, T0 + answered, code, 1, CUT_MODE)


def heard(job_id: str, at: float, via: str) -> dict[str, Any]:
    """The holder's line when it heard of the cancel (by the notification, or a renewal)."""
    return {
        "msg": "cancel requested, stopping the attempt", "job_id": job_id, "lease_token": 1,
        "via": via, "time": stamp(at),
    }  # fmt: skip


def probes(ends: dict[str, tuple[float, str]]) -> tuple[list[JobRow], list[Any], list[Any]]:
    rows = [row(j, "cancelled", type="chaos-slow") for j in ends]
    records = [r for j, (end, _) in ends.items() for r in run(j, 1, 0, end, "cancelled", pid=7)]
    logs = [
        e
        for j, (end, via) in ends.items()
        for e in (heard(j, end - 0.01, via), finished(j, 1, end + 0.01, "cancelled"))
    ]
    return rows, records, logs


def test_cancels_asked_around_a_listener_cut_are_summarized_with_their_latency() -> None:
    # p1 asked just before the cut, p2 while the listeners were gone, p3 once they were back.
    rows, records, logs = probes(
        {"p1": (2.3, "notification"), "p2": (4.0, "renewal"), "p3": (3.42, "notification")}
    )
    cancels = [cut_cancel("p1", 1.8, 1.85), cut_cancel("p2", 2.5, 2.55),
               cut_cancel("p3", 3.4, 3.41)]  # fmt: skip
    report = with_cancels(rows, records, logs, cancels, [cut()])
    assert report.violations == []
    assert report.summary["listener_cuts"] == [
        {
            "terminated": 6, "listeners_before": 6, "back_after_seconds": 1.0, "cancels": 3,
            "answers": {"202": 3}, "stopped": 3, "via": {"notification": 2, "renewal": 1},
            "stop_seconds": {"p50": 1.0, "max": 1.5},
            "stop_after_answer_seconds": {"p50": 0.95, "max": 1.45},
            "stop_after_listeners_back_seconds": {"p50": 0.15, "max": 1.0},
            "stop_seconds_once_back": {"p50": 0.02, "max": 0.02},
            "limit_seconds": 4.67,
        }
    ]  # fmt: skip
    assert report.summary["cancels"]["stop_seconds_by_mode"] == {CUT_MODE: {"p50": 0.5, "max": 1.5}}


def test_a_listener_cut_excuses_no_late_stop_and_must_prove_something() -> None:
    # A cut listener disturbs no lease: a holder that stops late was not excused by it.
    rows, records, logs = probes({"p1": (2.3, "notification"), "p2": (9.0, "renewal")})
    cancels = [cut_cancel("p1", 1.8, 1.85), cut_cancel("p2", 2.5, 2.55)]
    assert with_cancels(rows, records, logs, cancels, [cut(("p1", "p2"))]).violations == [
        "job p2: lease 1's handler (pid 7) ran on 6.45s after its cancel was answered 202"
    ]
    # Nothing terminated, listeners never back, no running job stopped by its cancel.
    finished_first = [cut_cancel("p1", 2.5, 2.55, code=409), cut_cancel("p2", 2.5, 2.55, 409)]
    done = [row(j, "completed", type="chaos-slow") for j in ("p1", "p2")]
    ran = [r for j in ("p1", "p2") for r in run(j, 1, 0, 1.0, "ok", pid=7)]
    wrote = [finished(j, 1, 1.01, "completed") for j in ("p1", "p2")]
    never = [cut(("p1", "p2"), terminated=0, back=None)]
    assert with_cancels(done, ran, wrote, finished_first, never).violations == [
        "cut_listener: no LISTEN connection was terminated",
        "cut_listener: the workers' listeners were not all back within 30s of the cut",
        "cut_listener: no running job was stopped by a cancel asked around the cut "
        "(answers {'409': 2})",
    ]  # fmt: skip


# --- the rollout phase: the previous release under load while the head migrates -----------

OLD_API, NEW_API = "http://127.0.0.1:9001", "http://127.0.0.1:9002"


def rolled(**kw: Any) -> Rollout:
    """A rollout from T0 to T0 + 30: migrated from 8 s to 9 s, the head ready at 15 s, the
    old services (worker pid 7) stopped at 24 s."""
    fields: dict[str, Any] = {
        "previous": "7ba0894", "started_at": T0, "ended_at": T0 + 30,
        "from_revision": "0006", "target_revision": "0007", "to_revision": "0007",
        "revisions_applied": ("0007",), "migration_exit": 0,
        "migration_started_at": T0 + 8, "migration_ended_at": T0 + 9,
        "old_services": ("api-prev-0", "worker-prev-0"), "old_apis": (OLD_API,),
        "new_apis": (NEW_API,), "old_worker_pids": (7,), "new_ready_at": T0 + 15,
        "old_stopped_at": T0 + 24, "old_exits": (("api-prev-0", 0), ("worker-prev-0", 0)),
    }  # fmt: skip
    return Rollout(**fields | kw)


def rollout_run(rollout: Rollout, server_errors: Any = ()) -> Any:
    rows = [row("o", "completed"), row("n", "completed"), row("r", "completed", token=2)]
    acks_ = [
        Ack("k-o", "o", 201, api=OLD_API, answered_at=T0 + 8.5),
        Ack("k-n", "n", 201, api=NEW_API, answered_at=T0 + 18),
        Ack("k-r", "r", 201, api=OLD_API, answered_at=T0 + 20),
    ]
    records = [*run("o", 1, 8.6, 8.7, "ok", pid=7), *run("n", 1, 18.1, 18.2, "ok", pid=8),
               *run("r", 1, 23.5, 24.05, "cancelled", pid=7),
               *run("r", 2, 24.5, 24.6, "ok", pid=8)]  # fmt: skip
    logs = [finished("o", 1, 8.8, "completed"), finished("n", 1, 18.3, "completed"),
            finished("r", 1, 24.1, "released"), finished("r", 2, 24.7, "completed")]  # fmt: skip
    return check(
        rows, acks_, records, logs, [], lease_duration=LEASE, rollout=rollout,
        server_errors=list(server_errors),
    )  # fmt: skip


def test_a_clean_rollout_is_summarized() -> None:
    report = rollout_run(rolled())
    assert report.violations == []
    assert report.summary["rollout"] == {
        "previous": "7ba0894", "from_revision": "0006", "to_revision": "0007",
        "target_revision": "0007", "revisions_applied": ["0007"], "migration_exit": 0,
        "migration_seconds": 1.0, "phase_seconds": 30.0, "acknowledged_by_old_apis": 2,
        "acknowledged_by_new_apis": 1, "executions_by_old_workers": 2,
        "executions_by_new_workers": 2, "executions_during_migration": 1,
        "acknowledged_during_migration": 1, "released_by_old_workers": 1,
        "old_exits": {"api-prev-0": 0, "worker-prev-0": 0}, "unready_samples": 0,
        "server_errors": 0,
    }  # fmt: skip
    assert report.summary["duplicate_causes"] == {"shutdown release": 1}
    # A migration with nothing to do is a rollout too.
    same = rolled(target_revision="0006", to_revision="0006", revisions_applied=())
    assert rollout_run(same).violations == []


def test_a_rollout_that_broke_anything_is_a_violation() -> None:
    bad = rolled(
        migration_exit=1, migration_output="sqlalchemy.exc.OperationalError: lock timeout",
        to_revision="0006", old_exits=(("api-prev-0", 0), ("worker-prev-0", None)),
        unready=(("api-prev-0", T0 + 8.5), ("api-prev-0", T0 + 9.0)),
        problems=("the head's services were not ready within 120s",),
    )  # fmt: skip
    errors = [
        ServerError(OLD_API, T0 + 8.7, 500, "POST /jobs"),
        ServerError(NEW_API, T0 + 40, 503, "POST /jobs"),  # after the phase: not its concern
    ]
    assert rollout_run(bad, errors).violations == [
        "rollout: the head's services were not ready within 120s",
        "rollout: alembic upgrade head exited 1 while the previous release served: "
        "sqlalchemy.exc.OperationalError: lock timeout",
        "rollout: worker-prev-0 was killed after not stopping on SIGTERM",
        "rollout: api-prev-0 was not ready 2 times while it should serve, first 8.5s into "
        "the phase, during the migration",
        f"rollout: POST /jobs answered 500 by {OLD_API} 8.7s into the phase, during the migration",
    ]
    migrated_short = rolled(to_revision="0006")
    assert rollout_run(migrated_short).violations == [
        "rollout: the schema is at 0006 after the migration, not at the head's 0007"
    ]
    idle = rolled(old_worker_pids=(99,), old_apis=("http://127.0.0.1:1",))
    assert rollout_run(idle).violations == [
        "rollout: the previous release's API acknowledged no job",
        "rollout: the previous release's workers ran no job",
    ]


# --- concurrency keys ----------------------------------------------------------------


def keyed_acks(*ids: str, key: str = "tenant-a", queue: str = "bulk") -> list[Ack]:
    return [Ack(f"key-{i}", i, 201, queue=queue, concurrency_key=key) for i in ids]


def checked_keys(rows: list[JobRow], acks_: list[Ack], records: list[Any], faults: Any = ()) -> Any:
    return check(rows, acks_, records, [], list(faults), lease_duration=LEASE, key_limit=2)


def test_more_attempts_of_one_key_at_once_than_its_limit_is_a_violation() -> None:
    ids = ["k1", "k2", "k3"]
    records = [*run("k1", 1, 0, 5, "ok"), *run("k2", 1, 1, 5, "ok"), *run("k3", 1, 2, 3, "ok")]
    report = checked_keys([row(i, "completed") for i in ids], keyed_acks(*ids), records)
    assert any("3 attempts ran at once (limit 2)" in v for v in report.violations)
    assert report.summary["keys"]["max_running"] == 3
    # The same attempts under two keys, or one after another, are within the limit.
    split = keyed_acks("k1", "k2") + keyed_acks("k3", key="tenant-b")
    report = checked_keys([row(i, "completed") for i in ids], split, records)
    assert report.violations == []
    assert report.summary["keys"]["max_running_by_key"] == {"bulk/tenant-a": 2, "bulk/tenant-b": 1}
    handed_on = [*run("k1", 1, 0, 2, "ok"), *run("k2", 1, 1, 5, "ok"), *run("k3", 1, 2, 3, "ok")]
    report = checked_keys([row(i, "completed") for i in ids], keyed_acks(*ids), handed_on)
    assert report.violations == []
    # Key-less jobs are not limited.
    report = checked_keys([row(i, "completed") for i in ids], acks(*ids), records)
    assert report.violations == [] and report.summary["keys"]["keyed_jobs"] == 0


def test_a_killed_holder_counts_against_its_key_until_its_lease_ran_out() -> None:
    ids = ["k1", "k2", "k3"]
    kill = Fault("kill_worker", "worker-0", T0 + 1, T0 + 2, T0 + 3, killed_pids=(100,))
    rows = [
        row("k1", "completed", attempts=2, token=2),
        row("k2", "completed"),
        row("k3", "completed"),
    ]
    # k1's holder (pid 100) was killed at 1 s: its lease held until 1 + 8 - 8/3 s at least.
    after_expiry = [
        *run("k1", 1, 0, None, None),
        *run("k1", 2, 10, 11, "ok", pid=200),
        *run("k2", 1, 2, 12, "ok", pid=200),
        *run("k3", 1, 8, 9, "ok", pid=200),
    ]
    report = checked_keys(rows, keyed_acks(*ids), after_expiry, [kill])
    assert not [v for v in report.violations if "key tenant-a" in v]
    within_lease = [
        *run("k1", 1, 0, None, None),
        *run("k1", 2, 10, 11, "ok", pid=200),
        *run("k2", 1, 2, 12, "ok", pid=200),
        *run("k3", 1, 5, 6, "ok", pid=200),
    ]
    report = checked_keys(rows, keyed_acks(*ids), within_lease, [kill])
    assert any("3 attempts ran at once" in v and "k1 lease 1" in v for v in report.violations)


def test_more_attempts_of_a_type_at_once_than_its_type_concurrency_is_a_violation() -> None:
    ids = ["s1", "s2", "s3", "f1"]
    records = [
        *run("s1", 1, 0, 5, "ok", type="chaos-slow"),
        *run("s2", 1, 1, 5, "ok", type="chaos-slow"),
        *run("s3", 1, 2, 3, "ok", type="chaos-slow"),
        *run("f1", 1, 2, 3, "ok"),
    ]
    rows = [row(i, "completed") for i in ids]

    def checked(limit: int) -> Any:
        return check(
            rows,
            acks(*ids),
            records,
            [],
            [],
            lease_duration=LEASE,
            type_limits={"chaos-slow": limit},
        )

    report = checked(2)
    assert any("type chaos-slow: 3 attempts ran at once (limit 2)" in v for v in report.violations)
    assert report.summary["type_limits"] == {
        "chaos-slow": {"limit": 2, "attempts": 3, "max_running": 3}
    }
    assert checked(3).violations == []  # and the other type is not counted


# --- queue pauses and bulk actions ----------------------------------------------------


def checked_admin(
    rows: list[JobRow], records: list[Any], logs: list[Any], faults: Any = (), **kw: Any
) -> Any:
    return check(
        rows, acks(*(r.id for r in rows)), records, logs, list(faults), lease_duration=LEASE, **kw
    )


def test_an_attempt_of_a_paused_queue_started_a_second_after_the_pause_is_a_violation() -> None:
    # Paused (answered) at 1 s, resumed at 6 s: a start at 1.8 s is a claim made within the
    # second, one at 4 s broke the pause, one at 6.5 s came after the resume.
    pause = QueuePause("bulk", T0 + 0.98, T0 + 1.0, T0 + 6.0, T0 + 6.02)
    rows = [row(i, "completed", queue="bulk") for i in ("a", "b", "c")]
    records = [*run("a", 1, 1.8, 2, "ok"), *run("b", 1, 4, 4.1, "ok"), *run("c", 1, 6.5, 7, "ok")]
    report = checked_admin(rows, records, [], pauses=[pause])
    assert report.violations == [
        "queue bulk: job b lease 1 started 3.00s after the pause was answered, "
        "2.00s before the resume was sent"
    ]
    summary = report.summary["pauses"]
    assert summary["pauses"] == 1 and summary["started_within_the_limit"] == 1
    assert summary["first_start_after_resume_seconds"] == {"p50": 0.5, "max": 0.5}
    # Another queue is not paused; a worker a fault cut off meanwhile may not have heard.
    other = [row(i, "completed", queue="default") for i in ("a", "b", "c")]
    assert checked_admin(other, records, [], pauses=[pause]).violations == []
    cut = Fault("proxy_blackhole", "worker-0", T0 + 2, T0 + 3, T0 + 5, partitioned_pids=(100,))
    report = checked_admin(rows, records, [], [cut], pauses=[pause])
    assert report.violations == []
    assert report.summary["pauses"]["started_by_disturbed_workers"] == 1


def bulk_cancel(sent: float, cancelled: int = 1, **filter_: Any) -> BulkAction:
    answer = {"cancelled": cancelled, "cancel_requested": 0, "more": False}
    return BulkAction("cancel", filter_, T0 + sent, T0 + sent + 0.02, 200, answer)


def test_a_bulk_cancelled_job_that_starts_again_is_a_violation() -> None:
    rows = [row("x", "cancelled", type="chaos-bulk", finished_at=ended(2.01))]
    again = run("x", 1, 3, 3.5, "ok")
    report = checked_admin(rows, again, [], bulk=[bulk_cancel(2.0, type="chaos-bulk")])
    assert report.violations == ["job x: lease 1 started 0.99s after the job was cancelled"]
    # Before its cancel it may have run, and failed; and a holder paused since its claim
    # may log its start late.
    before = run("x", 1, 1, 1.5, "error")
    assert (
        checked_admin(rows, before, [], bulk=[bulk_cancel(2.0, type="chaos-bulk")]).violations == []
    )
    report = checked_admin(
        rows, again, [], [paused(100)], bulk=[bulk_cancel(2.0, type="chaos-bulk")]
    )
    assert report.violations == []
    assert report.summary["bulk"]["stale_starts_after_cancel"] == 1


def test_a_job_cancelled_with_no_cancel_matching_it_or_also_completed_is_a_violation() -> None:
    rows = [row("x", "cancelled", type="chaos-bulk", finished_at=ended(2.01))]
    # A bulk cancel of another type (or queue) did not ask for it.
    report = checked_admin(rows, [], [], bulk=[bulk_cancel(2.0, cancelled=0, type="chaos-fast")])
    assert [v.split(" (")[0] for v in report.violations] == [
        "job x ended cancelled, but no cancel was asked before it finished"
    ]
    report = checked_admin(rows, [], [], bulk=[bulk_cancel(2.0, queue="default")])
    assert report.violations == []
    # Both a cancelled and a completed outcome applied for one job.
    done = [row("y", "completed", type="chaos-bulk", token=2, attempts=2)]
    records = [*run("y", 1, 0, 1, "cancelled"), *run("y", 2, 3, 4, "ok")]
    logs = [finished("y", 1, 1.1, "cancelled"), finished("y", 2, 4.1, "completed")]
    report = checked_admin(
        done, records, logs, bulk=[bulk_cancel(0.5, cancelled=0, type="chaos-bulk")]
    )
    assert "job y was both cancelled and completed" in report.violations
    # More jobs answered cancelled than ended so.
    report = checked_admin(rows, [], [], bulk=[bulk_cancel(2.0, cancelled=3, type="chaos-bulk")])
    assert any("answered 3 jobs cancelled, but only 1" in v for v in report.violations)


def test_a_dead_letter_runs_again_only_after_a_bulk_retry_naming_it() -> None:
    rows = [row("d", "dead_letter", attempts=1, token=2, max_attempts=1)]
    records = [*run("d", 1, 0, 1, "error"), *run("d", 2, 5, 6, "error")]
    records[-2]["attempt"] = records[-1]["attempt"] = 1  # a fresh budget: attempt 1 again
    logs = [finished("d", 1, 1.1, "dead_letter"), finished("d", 2, 6.1, "dead_letter")]
    unexplained = checked_admin(rows, records, logs)
    assert any(
        "ran again (lease 2) after lease 1 wrote dead_letter" in v for v in unexplained.violations
    )
    retry = BulkAction(
        "retry", {"ids": ["d"], "status": "dead_letter"}, T0 + 4, T0 + 4.02, 200, {"retried": 1}
    )
    report = checked_admin(rows, records, logs, bulk=[retry])
    assert report.violations == []
    assert report.summary["duplicate_causes"] == {}
    assert report.summary["runs_after_a_bulk_retry"] == 1
    assert report.summary["bulk"]["retried"] == 1
    # A retry sent only after the re-run explains nothing.
    late = BulkAction("retry", {"ids": ["d"], "status": "dead_letter"}, T0 + 5.5)
    assert checked_admin(rows, records, logs, bulk=[late]).violations != []
