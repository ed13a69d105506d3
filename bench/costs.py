"""What heartbeats and per-type limits cost our worker: two pairs of drains, with and without.

Each drain is `bench.measure.drain` (jobs inserted in one transaction, rate from its
commit to the last completion) on a fresh database and its own `jobqueue-worker`;
the two runs of a pair differ in one setting only, and which runs first alternates
with the repeat. Each run also reports the worker processes' CPU per job (from /proc).

Heartbeats: jobs of `SLEEP_SECONDS` each, so every worker process always holds
leases; LEASE_DURATION=3s (each process renews its leases every second) against
LEASE_DURATION=48h (no renewal falls due during the drain). The leases the
heartbeats found lost are read from /metrics: any would void the comparison.

Limits: no-op jobs, every tenth of `LIMITED_TYPE`; TYPE_CONCURRENCY for that type,
high enough not to hold it back, against no limit at all. With a limit, that type
is claimed by its own locked transaction and every other claim skips it, so the
ratio is the mechanism's cost, not the limit's. When each type finished is kept,
to show whether the limit held its type back after all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import measure, pg, profile
from bench.adapters.base import to_the_end
from bench.adapters.ours import MAX_ATTEMPTS, Ours
from bench.adapters.ours_jobs import JOB_TYPE, LIMITED_TYPE, SLEEP_SECONDS, SLEEP_TYPE
from bench.beacon import Receiver
from bench.stats import median
from bench.webhooks import cpu_seconds
from jobcore.ids import new_id
from jobcore.rows import NewJob

LEASES = {"renewing": "3s", "idle": "48h"}  # LEASE_DURATION of each heartbeat run
LIMITED_EVERY = 10  # one job in ten is of the limited type
CONCURRENCY = 20  # TYPE_CONCURRENCY of the limited type
HEARTBEAT_TARGET = 0.95  # drain with renewals over the one without, at least
LIMITS_TARGET = 0.80  # drain with a limited type in the mix over the one without, at least


async def drain_with_cpu(
    ours: Ours,
    rx: Receiver,
    processes: int,
    jobs: list[NewJob],
    limit: float,
    env: dict[str, str],
    counter: Callable[[], Awaitable[float]] | None = None,
    before_start: Callable[[], Awaitable[object]] | None = None,
) -> dict[str, Any]:
    """A fresh database (`before_start` then runs on it) and a worker started with `env`,
    warmed up; then `jobs` drained. Adds the worker processes' CPU per job and, given a
    `counter` (read before and after the drain), its growth per job as `counted_per_job`."""
    await ours.prepare()
    if before_start is not None:
        await before_start()
    await ours.start_workers(processes, **env)
    await measure.warm_up(
        ours,
        rx,
        processes,
        submit=lambda payload: ours.insert([NewJob(new_id(), JOB_TYPE, payload, MAX_ATTEMPTS)]),
    )

    async def enqueue(n: int) -> None:
        await ours.insert(jobs)

    pids = profile.worker_children(ours.worker_procs[0].pid)
    if len(pids) != processes:
        raise RuntimeError(f"found {len(pids)} worker processes, not {processes}")
    cpu = cpu_seconds(pids)
    counted = await counter() if counter is not None else 0.0
    figures = await measure.drain(ours, len(jobs), limit, enqueue)
    used = cpu_seconds(pids) - cpu
    out = {**figures, "worker_cpu_us_per_job": used / len(jobs) * 1e6}
    if counter is not None:
        out["counted_per_job"] = (await counter() - counted) / len(jobs)
    return out


async def heartbeat_session(
    server: str,
    workdir: Path,
    rx: Receiver,
    workers: int,
    processes: int,
    n: int,
    limit: float,
    variant: str,
) -> dict[str, Any]:
    """One heartbeat run: `variant` "renewing" or "idle" (see `LEASES`)."""
    jobs = [NewJob(new_id(), SLEEP_TYPE, {}, MAX_ATTEMPTS) for _ in range(n)]
    lease = LEASES[variant]
    ours = Ours(server, workdir, workers)
    try:
        figures = await drain_with_cpu(ours, rx, processes, jobs, limit, {"LEASE_DURATION": lease})
        figures["leases_lost"] = int(await ours.metric("jobs_lease_lost_total"))
    finally:
        await to_the_end(ours.cleanup())
    return {
        "variant": variant,
        "lease_duration": lease,
        "processes": processes,
        "workers": workers,
        **figures,
    }


async def limits_session(
    server: str,
    workdir: Path,
    rx: Receiver,
    workers: int,
    processes: int,
    n: int,
    limit: float,
    variant: str,
) -> dict[str, Any]:
    """One limits run: `variant` "limited" (TYPE_CONCURRENCY set) or "unlimited"."""
    jobs = [
        NewJob(new_id(), LIMITED_TYPE if i % LIMITED_EVERY == 0 else JOB_TYPE, {}, MAX_ATTEMPTS)
        for i in range(n)
    ]
    env = {"TYPE_CONCURRENCY": f"{LIMITED_TYPE}:{CONCURRENCY}"} if variant == "limited" else {}
    ours = Ours(server, workdir, workers)
    try:
        figures = await drain_with_cpu(ours, rx, processes, jobs, limit, env)
        assert ours.sql.conn is not None
        rows = await ours.sql.conn.fetch(
            "SELECT type = $1, extract(epoch FROM max(updated_at))::float8"
            f" FROM {pg.RETAINED}"
            " WHERE status = 'completed' GROUP BY 1",
            LIMITED_TYPE,
        )
    finally:
        await to_the_end(ours.cleanup())
    last = {limited: at for limited, at in rows}
    # Seconds from the enqueue's commit, as the drain's own duration is counted.
    end = max(last.values())
    return {
        "variant": variant,
        "processes": processes,
        "workers": workers,
        **figures,
        "limited_finished_s": figures["drain_seconds"] - (end - last[True]),
        "others_finished_s": figures["drain_seconds"] - (end - last[False]),
    }


# --- summary -------------------------------------------------------------------------


def _pair(rows: list[dict[str, Any]], with_: str, without: str) -> dict[str, Any] | None:
    mine = [r for r in rows if r["variant"] == with_]
    theirs = [r for r in rows if r["variant"] == without]
    if not mine or not theirs:
        return None
    rate = median([r["drain_jobs_per_s"] for r in mine])
    base = median([r["drain_jobs_per_s"] for r in theirs])
    return {
        "processes": rows[0]["processes"],
        "workers": rows[0]["workers"],
        "jobs_per_s": rate,
        "without_jobs_per_s": base,
        "ratio": rate / base,
        # The worker processes' own CPU (user + system) over the drain, per job: it moves
        # far less with the machine's load than the rate does.
        "worker_cpu_us_per_job": median([r["worker_cpu_us_per_job"] for r in mine]),
        "without_worker_cpu_us_per_job": median([r["worker_cpu_us_per_job"] for r in theirs]),
        "repeats": {
            with_: [r["drain_jobs_per_s"] for r in mine],
            without: [r["drain_jobs_per_s"] for r in theirs],
        },
    }


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats of each run; the ratio of each pair's medians (with / without)."""
    out: dict[str, Any] = {}
    beats = [r for r in results if r["kind"] == "heartbeats"]
    pair = _pair(beats, "renewing", "idle")
    if pair:
        out["heartbeats"] = {
            "job_seconds": SLEEP_SECONDS,
            "lease_duration": LEASES["renewing"],
            "without_lease_duration": LEASES["idle"],
            **pair,
            "leases_lost": sum(r["leases_lost"] for r in beats),
        }
    limited = [r for r in results if r["kind"] == "type_limits"]
    pair = _pair(limited, "limited", "unlimited")
    if pair:
        held = [r for r in limited if r["variant"] == "limited"]
        out["type_limits"] = {
            "limited_share": 1 / LIMITED_EVERY,
            "type_concurrency": f"{LIMITED_TYPE}:{CONCURRENCY}",
            **pair,
            "limited_finished_s": median([r["limited_finished_s"] for r in held]),
            "others_finished_s": median([r["others_finished_s"] for r in held]),
        }
    return out


def targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    beats = section.get("heartbeats")
    if beats:
        out.append(
            {
                "target": "drain with heartbeats renewing (LEASE_DURATION="
                f"{beats['lease_duration']}) vs none due ({beats['without_lease_duration']}),"
                " no lease lost (ratio)",
                "goal": f">= {HEARTBEAT_TARGET:.2f}",
                "measured": beats["ratio"],
                "met": beats["ratio"] >= HEARTBEAT_TARGET and beats["leases_lost"] == 0,
            }
        )
    limits = section.get("type_limits")
    if limits:
        out.append(
            {
                "target": f"drain with {limits['limited_share']:.0%} of the jobs of a type under "
                "TYPE_CONCURRENCY vs no limits (ratio)",
                "goal": f">= {LIMITS_TARGET:.2f}",
                "measured": limits["ratio"],
                "met": limits["ratio"] >= LIMITS_TARGET,
            }
        )
    return out


def lines(section: dict[str, Any]) -> list[str]:
    """The section as text lines for the report."""
    beats, limits = section.get("heartbeats"), section.get("type_limits")
    first = beats or limits
    if not first:
        return []
    out = [
        "",
        f"Cost of heartbeats and per-type limits ({first['processes']} process(es), "
        f"WORKERS={first['workers']}; each ratio: with / without)",
    ]
    if beats:
        out += [
            f"  heartbeats, jobs of {beats['job_seconds'] * 1000:.0f} ms: "
            f"LEASE_DURATION={beats['lease_duration']} {beats['jobs_per_s']:,.0f} jobs/s vs "
            f"{beats['without_lease_duration']} {beats['without_jobs_per_s']:,.0f} jobs/s: "
            f"{beats['ratio']:.2f}x ({beats['leases_lost']} lease(s) lost)",
            _cpu(beats),
        ]
    if limits:
        out += [
            f"  {limits['limited_share']:.0%} of the jobs limited, TYPE_CONCURRENCY="
            f"{limits['type_concurrency']}: {limits['jobs_per_s']:,.0f} jobs/s vs no limits "
            f"{limits['without_jobs_per_s']:,.0f} jobs/s: {limits['ratio']:.2f}x (limited type "
            f"done after {limits['limited_finished_s']:.2f} s, the others after "
            f"{limits['others_finished_s']:.2f} s)",
            _cpu(limits),
        ]
    return out


def _cpu(pair: dict[str, Any]) -> str:
    return (
        f"    worker CPU per job {pair['worker_cpu_us_per_job']:.0f} µs vs "
        f"{pair['without_worker_cpu_us_per_job']:.0f} µs"
    )
