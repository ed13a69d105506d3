"""`make bench-pressure`: how the queue behaves while something holds back PostgreSQL's
xmin horizon (so vacuum cannot remove the dead rows every claim and completion leaves),
and how it recovers once that stops.

    python -m bench.pressure [--quick] [--scenario idle-xid repeatable-read rate-1.5x]
                             [--rate 800] [--clean 60] [--pressure 240] [--recovery 180]
                             [--json PATH] [--server URL]

Each scenario gets a fresh database migrated to head and fresh services, as a user runs
them (`bench.adapters.ours.Ours`): one `jobqueue-api` and one `jobqueue-worker` with
WORKER_PROCESSES=2 x WORKERS=16 running the bench's no-op type, warmed up until both
processes ran a job. A producer (`bench.pressure_load.Producer`) offers a fixed rate of
jobs through POST /jobs/batch, a batch every 50 ms scheduled by absolute time, through
three phases: clean, pressure, recovery. During pressure:

- `idle-xid`: one session runs `BEGIN; SELECT txid_current();` and stays idle in that
  transaction until the phase ends, then rolls back;
- `repeatable-read`: four sessions each hold one REPEATABLE READ transaction and count the
  jobs table every 100 ms in it;
- `rate-1.5x`: nothing holds the horizon; the offered rate is 1.5x.

Per phase: the offered and accepted rates, and the p99 from a batch's tick to its answer;
the median of the jobs completed in each second (from the completed jobs' `finished_at`,
read after the scenario); claim latency p50/p99; the backlog (pending jobs, sampled every
second: the maximum, and a count at the phase's end); at its end each table's n_dead_tup
(pg_stat_user_tables) and every relation's size (indexes have no dead-tuple count). Then
pressure and recovery over clean, and how long after the release the jobs table's dead
tuples were under 10,000 (sampled every second of the recovery).

Claim latency is handler start − run_at. The product stores no attempt start: the claim's
`updated_at` is overwritten when the attempt ends, which for a no-op job is milliseconds
later, so reading processing rows would sample almost nothing. Instead one job in ten
carries a `bench.beacon` marker and the bench's no-op handler sends its `time.time()` as
its first statement; run_at (the submitting transaction's now(), the same machine clock)
is read by job id afterwards. A sample belongs to the phase its handler started in.

On a server with autovacuum off (the development server), `bench.retention.StandInVacuum`
vacuums the jobs table by autovacuum's rule, so that there is a vacuum to hold back; its
first check comes at a random point of the first naptime, since checks in step with the
phases (60 s, 240 s) would vacuum right at the release in every run. The sampler also
counts the vacuums of the jobs table, so the report says when the first one after the
release had finished: the dead-tuple recovery time mostly follows that schedule.
Table on stdout, JSON in bench-results/pressure-<UTC time>.json (or --json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench import measure, pg, procs
from bench import pressure_load as load
from bench.adapters.base import log_tail, to_the_end
from bench.adapters.ours import Ours
from bench.beacon import Receiver
from bench.pressure_report import (
    PHASES,
    SCENARIOS,
    first_vacuum_after,
    phase_figures,
    phase_of,
    ratios,
    recovered_after,
    render,
)
from bench.procs import ROOT
from bench.progress import Progress
from bench.queues import _code_version, machine
from bench.retention import StandInVacuum

PROCESSES, WORKERS = 2, 16
SETTINGS = (
    "autovacuum",
    "autovacuum_naptime",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_cost_delay",
    "idle_in_transaction_session_timeout",
)


@dataclass
class Config:
    rate: float = 800.0
    clean: float = 60.0
    pressure: float = 240.0
    recovery: float = 180.0
    scenarios: list[str] = field(default_factory=lambda: list(SCENARIOS))
    server: str = ""
    json: str = ""
    # Fixed, recorded for the report.
    processes: int = PROCESSES
    workers: int = WORKERS
    tick: float = load.TICK
    mark_every: int = load.MARK_EVERY

    def seconds(self, phase: str) -> float:
        return float(getattr(self, phase))

    def rate_in(self, scenario: str, phase: str) -> float:
        return self.rate * (1.5 if scenario == "rate-1.5x" and phase == "pressure" else 1.0)


QUICK = {"rate": 200.0, "clean": 8.0, "pressure": 12.0, "recovery": 8.0}


async def _hold(scenario: str, url: str, stop: asyncio.Event) -> dict[str, Any]:
    if scenario == "idle-xid":
        return await load.hold_idle_xid(url, stop)
    if scenario == "repeatable-read":
        return await load.hold_repeatable_read(url, stop)
    await stop.wait()
    return {}


async def scenario(
    config: Config, name: str, rx: Receiver, workdir: Path, progress: Progress, naptime: float
) -> dict[str, Any]:
    """Fresh database and services, the three phases, then the figures read back."""
    ours = Ours(config.server, workdir, WORKERS)
    vacuum: StandInVacuum | None = None
    try:
        await ours.prepare()
        await ours.start_api()
        await ours.start_workers(PROCESSES)
        await measure.warm_up(ours, rx, PROCESSES)
        assert ours.api is not None and ours.sql.conn is not None
        conn = ours.sql.conn
        # Checks in step with the phases would vacuum right at the release, every run.
        vacuum = StandInVacuum(ours.url, first=random.uniform(0, naptime))
        await vacuum.start()
        logged = ours.worker_log_size()
        producer = load.Producer(ours.api, rx, config.rate)
        sampler = load.Sampler(await asyncpg.connect(ours.url))
        stop = asyncio.Event()
        running = [
            asyncio.create_task(producer.run(stop)),
            asyncio.create_task(sampler.run(stop)),
        ]
        loop = asyncio.get_running_loop()
        bounds: dict[str, tuple[float, float]] = {}
        ends: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        holder: dict[str, Any] = {}
        release = asyncio.Event()
        held: asyncio.Task[dict[str, Any]] | None = None
        try:
            start, started = time.time(), loop.time()
            for i, phase in enumerate(PHASES):
                progress.step(f"{name}: {phase} ({config.seconds(phase):g} s)")
                if phase == "pressure":
                    held = asyncio.create_task(_hold(name, ours.url, release))
                deadline = started + config.seconds(phase)
                while loop.time() < deadline:
                    await asyncio.sleep(min(1.0, deadline - loop.time()))
                    _check_alive(ours, held if phase == "pressure" else None)
                if phase == "pressure" and held is not None:
                    release.set()
                    holder = await held
                end, started = time.time(), loop.time()
                bounds[phase] = (start, end)
                # The next phase starts now: the reads at this one's end fall in it.
                after = PHASES[i + 1] if i + 1 < len(PHASES) else "after"
                producer.phase = sampler.phase = after
                producer.rate = config.rate_in(name, after)
                ends[phase] = (int(await conn.fetchval(load.PENDING)), await load.relations(conn))
                start = end
                progress.advance()
        finally:
            stop.set()
            release.set()
            await asyncio.gather(*running, *([held] if held else []), return_exceptions=True)
            await sampler.conn.close()
        for task in running:
            task.result()  # a sampler or producer that failed voids the scenario
        starts, unstarted = await load.handler_starts(conn, producer.marked)
        phases = {}
        for phase in PHASES:
            phase_start, phase_end = bounds[phase]
            backlog_end, rels = ends[phase]
            phases[phase] = phase_figures(
                seconds=phase_end - phase_start,
                completions=await load.completions(conn, phase_start, phase_end),
                target_rate=config.rate_in(name, phase),
                offered=producer.offered[phase],
                accepted=producer.accepted[phase],
                latencies=[lat for at, lat in starts if phase_of(at, bounds) == phase],
                requests=producer.request_s[phase],
                backlog=[s["pending"] for s in sampler.samples if s["phase"] == phase],
                backlog_end=backlog_end,
                relations=rels,
            )
        released = bounds["pressure"][1]
        dead = [(s["at"], s["dead"]) for s in sampler.samples if s["phase"] == "recovery"]
        vacuums = [(s["at"], s["vacuums"]) for s in sampler.samples]
        return {
            "jobs_relation": await conn.fetchval(load.JOBS_RELATION, load.JOBS),
            "phases": phases,
            "ratios": ratios(phases),
            "dead_tuples_recovered_s": recovered_after(dead, released),
            "first_vacuum_after_release_s": first_vacuum_after(vacuums, released),
            "stand_in_vacuum_first_check_s": None if vacuum.autovacuum else vacuum.first,
            "holder": holder,
            "failed_jobs": sum(producer.failed.values()),
            "submit_errors": producer.errors,
            "sampled_jobs_not_started": unstarted,
            "harness_vacuums": vacuum.vacuums,
            "database_outages": ours.outages_since(logged),
            "samples": sampler.samples,
        }
    finally:
        if vacuum is not None:
            await to_the_end(vacuum.stop())
        await to_the_end(ours.cleanup())


def _check_alive(ours: Ours, held: asyncio.Task[Any] | None) -> None:
    """Fail the scenario at once, not at its end, if a service or the holder died."""
    for proc, log in (
        (ours.api_proc, "jobqueue-api.log"),
        (ours.worker_procs[0], "jobqueue-worker.log"),
    ):
        if proc is not None and proc.poll() is not None:
            tail = log_tail(ours.workdir / log)
            raise RuntimeError(f"{log.removesuffix('.log')} exited with {proc.returncode}\n{tail}")
    if held is not None and held.done():
        held.result()  # raises what ended the holder early
        raise RuntimeError("the horizon holder ended before the phase did")


async def execute(config: Config, progress: Progress | None = None) -> dict[str, Any]:
    """Every scenario of `config`, one after the other; `progress` (one step a phase) is
    the caller's when it runs this within a larger run (`bench.queues`)."""
    rx = await Receiver.open()
    workdir = Path(tempfile.mkdtemp(prefix="jobqueue-bench-pressure-"))
    own = progress is None
    progress = progress or Progress(len(config.scenarios) * len(PHASES))
    scenarios: dict[str, Any] = {}
    errors = []
    admin = await asyncpg.connect(config.server)
    try:
        settings = dict(
            await admin.fetch(
                "SELECT name, setting FROM pg_settings WHERE name = ANY($1)", list(SETTINGS)
            )
        )
        for name in await pg.drop_stale(config.server):
            print(f"dropped stale benchmark database {name}", file=sys.stderr)
        for name in config.scenarios:
            try:
                naptime = float(settings["autovacuum_naptime"])
                scenarios[name] = await scenario(config, name, rx, workdir, progress, naptime)
            except Exception as exc:
                errors.append(
                    {"scenario": name, "error": repr(exc), "trace": traceback.format_exc()}
                )
    finally:
        if own:
            progress.close()
        await admin.close()
        rx.close()
        shutil.rmtree(workdir, ignore_errors=True)
    autovacuum = settings.get("autovacuum") == "on"
    return {
        "server_settings": settings,
        "vacuum": "autovacuum"
        if autovacuum
        else "autovacuum off on this server: the harness vacuums by its rule every "
        f"{settings.get('autovacuum_naptime')} s",
        "jobs_table": load.JOBS,
        "scenarios": scenarios,
        "errors": errors,
    }


def parse_args(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pressure", description=__doc__.split("\n")[0]
    )
    d = Config()
    parser.add_argument("--quick", action="store_true", help="8 s / 12 s / 8 s at 200 jobs/s")
    parser.add_argument("--scenario", nargs="+", choices=SCENARIOS, help="default: all three")
    parser.add_argument("--rate", type=float, help=f"offered jobs/s (default {d.rate:g})")
    for phase in PHASES:
        parser.add_argument(
            f"--{phase}", type=float, help=f"seconds (default {d.seconds(phase):g})"
        )
    parser.add_argument(
        "--json", help="where the JSON goes (default bench-results/pressure-<time>.json)"
    )
    parser.add_argument(
        "--server",
        help="PostgreSQL maintenance URL (default $BENCH_DATABASE_URL, else the local server)",
    )
    args = parser.parse_args(argv)
    config = Config()
    if args.quick:
        for key, value in QUICK.items():
            setattr(config, key, value)
    for key in ("rate", *PHASES, "server", "json"):
        if getattr(args, key) is not None:
            setattr(config, key, getattr(args, key))
    if args.scenario:
        config.scenarios = list(dict.fromkeys(args.scenario))
    if config.rate <= 0 or min(config.seconds(p) for p in PHASES) < 2:
        parser.error("--rate must be positive and every phase at least 2 seconds")
    config.server = config.server or pg.server_url()
    return config


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    started, load_before = datetime.now(UTC), os.getloadavg()
    try:
        measured = asyncio.run(execute(config))
    except KeyboardInterrupt:
        print("interrupted: services stopped, databases dropped", file=sys.stderr)
        return 130
    document = {
        "started": started.isoformat(),
        "finished": datetime.now(UTC).isoformat(),
        "machine": machine(config.server)
        # Other work on the machine moves every figure: compare only within one run.
        | {"load_average": {"start": load_before, "end": os.getloadavg()}},
        "code": _code_version(),
        "config": asdict(config) | {"server": "(omitted)"},
        **measured,
        "process_groups": procs.STARTED,
    }
    path = Path(config.json or ROOT / "bench-results" / f"pressure-{started:%Y%m%dT%H%M%SZ}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(render(document))
    print(f"\nJSON: {path}")
    for error in document["errors"]:
        print(f"\n{error['scenario']}: {error['error']}\n{error['trace']}", file=sys.stderr)
    return 1 if document["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
