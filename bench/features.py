"""Our queue's drain with its features on, a system of its own in `bench.queues`' round-robin.

Each repeat, next to our plain drain and the peers' (same job count, same no-op job): a
fresh database holding `prefill` completed jobs a day or two old (`bench.retention`'s
PREFILL, then VACUUM ANALYZE); a `jobqueue-worker` of `processes` x `workers` with

- QUEUES=a,b: the jobs are spread over both queues, priorities random in -100..100
  (as `bench.scheduling`'s two-queue drain);
- LEASE_DURATION=3s: every process renews its running jobs' leases every second (as
  `bench.costs`' "renewing" run);
- TYPE_CONCURRENCY=bench-limited:20: every tenth job is of that type (as `bench.costs`'
  "limited" run), a limit too high to hold the drain back, so what it costs is the
  mechanism;
- RETENTION_COMPLETED=1h: retention prunes the prefilled jobs (5,000 a second at the
  default RETENTION_RATE) while the drain runs, but never the drained jobs, whose
  completion times the rate is read from.

The worker is warmed up, the harness waits for retention's first prune, then
`bench.measure.drain` runs. Reported besides the rate: the worker processes' CPU per
job (/proc), leases lost (`jobs_lease_lost_total`, must stay 0), rows pruned before and
during the drain and the prefilled rows left after it (some left: pruning ran through
the whole drain), and database outages the worker logged (any voids the run).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import random
import time
from pathlib import Path
from typing import Any

from bench import costs, measure, pg, profile, retention, scheduling, step
from bench.adapters.base import to_the_end
from bench.adapters.ours import MAX_ATTEMPTS, Ours
from bench.adapters.ours_jobs import JOB_TYPE, LIMITED_TYPE
from bench.beacon import Receiver
from bench.stats import median
from bench.webhooks import cpu_seconds
from jobcore.ids import new_id
from jobcore.rows import NewJob

SYSTEM = "jobqueue (features on)"
OURS = "jobqueue"
SETTINGS = {
    "QUEUES": ",".join(scheduling.QUEUES),
    "LEASE_DURATION": costs.LEASES["renewing"],
    "TYPE_CONCURRENCY": f"{LIMITED_TYPE}:{costs.CONCURRENCY}",
    # Older than every drained job can get, younger than every prefilled one.
    "RETENTION_COMPLETED": "1h",
}
# The peers' drains this one is set against, and the ratio each must reach.
PEERS = {"pgqueuer": ("PgQueuer", 2.0), "procrastinate": ("Procrastinate", 10.0)}
STATED_PROCESSES = 2  # the process count the targets are stated for
FIRST_PRUNE_LIMIT = 60.0  # seconds retention gets to delete its first batch

_OLD = (
    f"SELECT count(*) FROM {pg.RETAINED}"
    " WHERE status = 'completed' AND finished_at < now() - interval '1 hour'"
)


def describe(workers: int) -> dict[str, Any]:
    """The settings in force, for the report's list of systems."""
    return {
        "version": importlib.metadata.version("jobqueue"),
        "settings": {
            "WORKERS": workers,
            **SETTINGS,
            "jobs": f"every {costs.LIMITED_EVERY}th of {LIMITED_TYPE}, the others {JOB_TYPE}; "
            f"queue and priority ({scheduling.PRIORITIES[0]}..{scheduling.PRIORITIES[1]}) "
            "random",
            "other settings": "defaults",
        },
    }


def jobs(n: int) -> list[NewJob]:
    """`n` no-op jobs over both queues, mixed priorities, every tenth of the limited type."""
    rng = random.Random(n)
    return [
        NewJob(
            new_id(),
            LIMITED_TYPE if i % costs.LIMITED_EVERY == 0 else JOB_TYPE,
            {},
            MAX_ATTEMPTS,
            queue=rng.choice(scheduling.QUEUES),
            priority=rng.randint(*scheduling.PRIORITIES),
        )
        for i in range(n)
    ]


async def _first_prune(ours: Ours) -> None:
    deadline = time.monotonic() + FIRST_PRUNE_LIMIT
    while await retention.pruned_total(ours) == 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"retention pruned nothing within {FIRST_PRUNE_LIMIT:.0f}s")
        await asyncio.sleep(0.05)


async def session(
    server: str,
    workdir: Path,
    rx: Receiver,
    workers: int,
    processes: int,
    n: int,
    prefill: int,
    limit: float,
) -> dict[str, Any]:
    """One drain of `n` jobs with the features on; a "session" row of system `SYSTEM`."""
    ours = Ours(server, workdir, workers)
    try:
        await ours.prepare()
        assert ours.sql.conn is not None
        await ours.sql.conn.execute(retention.PREFILL, prefill, timeout=1800)
        await ours.sql.conn.execute("VACUUM ANALYZE jobqueue.jobs", timeout=1800)
        await ours.start_workers(processes, **SETTINGS)
        await measure.warm_up(
            ours,
            rx,
            processes,
            submit=lambda payload: ours.insert(
                [NewJob(new_id(), JOB_TYPE, payload, MAX_ATTEMPTS, queue=scheduling.QUEUES[0])]
            ),
        )
        await _first_prune(ours)
        batch = jobs(n)

        async def enqueue(_: int) -> None:
            await ours.insert(batch)

        before = await retention.pruned_total(ours)
        logged = ours.worker_log_size()
        pids = profile.worker_children(ours.worker_procs[0].pid)
        cpu = cpu_seconds(pids)
        figures = await measure.drain(ours, n, limit, enqueue)
        used = cpu_seconds(pids) - cpu
        after = await retention.pruned_total(ours)
        lost = int(await ours.metric("jobs_lease_lost_total"))
        left = int(await ours.sql.value(_OLD))
        outages = ours.outages_since(logged)
    finally:
        await to_the_end(ours.cleanup())
    return {
        "kind": "session",
        "system": SYSTEM,
        "processes": processes,
        "workers": workers,
        "jobs": n,
        **figures,
        "worker_cpu_us_per_job": used / n * 1e6,
        "prefill": prefill,
        "pruned_before_drain": before,
        "pruned_during_drain": after - before,
        "prefill_left_after_drain": left,
        "leases_lost": lost,
        "database_outages": outages,
    }


# --- summary -------------------------------------------------------------------------


def summarize(results: list[dict[str, Any]], systems: dict[str, Any]) -> dict[str, Any]:
    """Medians over repeats; the ratios to our plain drain and the peers' of the same
    process count (`systems`: the report's per-system medians)."""
    rows = [r for r in results if r["kind"] == "session" and r["system"] == SYSTEM]
    if not rows:
        return {}
    processes, workers = rows[0]["processes"], rows[0]["workers"]
    key = f"drain_{processes}proc_jobs_per_s"
    rate = median([r["drain_jobs_per_s"] for r in rows])
    plain = [
        r
        for r in results
        if r["kind"] == "session"
        and r["system"] == OURS
        and r["processes"] == processes
        and r["workers"] == workers
    ]
    plain_cpu = [r["worker_cpu_us_per_job"] for r in plain if "worker_cpu_us_per_job" in r]
    versus: dict[str, dict[str, float | None]] = {}
    for name in (OURS, *PEERS):
        theirs = systems.get(name, {}).get(key)
        if theirs:
            versus[name] = {"jobs_per_s": theirs, "ratio": rate / theirs}
    return {
        "processes": processes,
        "workers": workers,
        "jobs": rows[0]["jobs"],
        "settings": SETTINGS,
        "limited_share": 1 / costs.LIMITED_EVERY,
        "jobs_per_s": rate,
        "versus": versus,
        "worker_cpu_us_per_job": median([r["worker_cpu_us_per_job"] for r in rows]),
        "plain_worker_cpu_us_per_job": median(plain_cpu) if plain_cpu else None,
        "prefill": rows[0]["prefill"],
        "pruned_during_drain": median([r["pruned_during_drain"] for r in rows]),
        # Retention had begun before every drain and had prefilled rows left after it.
        "pruning_throughout": all(
            r["pruned_before_drain"] > 0 and r["prefill_left_after_drain"] > 0 for r in rows
        ),
        "leases_lost": sum(r["leases_lost"] for r in rows),
        "database_outages": sum(r["database_outages"] for r in rows),
        "repeats": [r["drain_jobs_per_s"] for r in rows],
    }


def target_name(processes: int, peer: str) -> str:
    return f"drain {processes} procs with the features on vs {PEERS[peer][0]} (jobs/s)"


def targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per peer measured in the run: the rate, theirs, the ratio."""
    if not section:
        return []
    out = []
    processes = section["processes"]
    sound = (
        section["leases_lost"] == 0
        and section["database_outages"] == 0
        and section["pruning_throughout"]
    )
    stated = "" if processes == STATED_PROCESSES else f" (stated for {STATED_PROCESSES} procs)"
    for peer, (_, bound) in PEERS.items():
        theirs = section["versus"].get(peer)
        if theirs is None:
            continue
        ratio = theirs["ratio"]
        out.append(
            {
                "target": target_name(processes, peer),
                "goal": f">= {bound:g}x{stated}",
                "measured": section["jobs_per_s"],
                "versus": theirs["jobs_per_s"],
                "ratio": ratio,
                # A lost lease, an outage or a drain retention did not run through voids it.
                "met": ratio is not None and ratio >= bound and sound,
            }
        )
    return out


def lines(section: dict[str, Any]) -> list[str]:
    """The section as text lines for the report."""
    if not section:
        return []
    s = section["settings"]
    out = [
        "",
        f"{SYSTEM}: drain of {section['jobs']:,} no-op jobs, {section['processes']} process(es),"
        f" WORKERS={section['workers']}, QUEUES={s['QUEUES']} with random priorities, "
        f"LEASE_DURATION={s['LEASE_DURATION']}, {section['limited_share']:.0%} of the jobs under "
        f"TYPE_CONCURRENCY={s['TYPE_CONCURRENCY']}, RETENTION_COMPLETED="
        f"{s['RETENTION_COMPLETED']} pruning {section['prefill']:,} old jobs",
        f"  {section['jobs_per_s']:,.0f} jobs/s (repeats "
        + " / ".join(f"{v:,.0f}" for v in section["repeats"])
        + f"); {section['pruned_during_drain']:,.0f} rows pruned during a drain"
        + ("" if section["pruning_throughout"] else ", pruning did NOT run through every drain")
        + f"; {section['leases_lost']} lease(s) lost{step.outages(section['database_outages'])}",
    ]
    names = {OURS: "our plain drain", **{k: v[0] for k, v in PEERS.items()}}
    for name, theirs in section["versus"].items():
        out.append(
            f"  vs {names[name]}: {theirs['jobs_per_s']:,.0f} jobs/s, {theirs['ratio']:.2f}x"
        )
    plain_cpu = section["plain_worker_cpu_us_per_job"]
    out.append(
        f"  worker CPU per job {section['worker_cpu_us_per_job']:.0f} µs"
        + ("" if plain_cpu is None else f" vs {plain_cpu:.0f} µs in our plain drain")
    )
    return out
