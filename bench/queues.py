"""`make bench` / `make bench-compare`: our queue, and optionally its peers, measured in one run.

    python -m bench.queues [--compare] [--quick] [--jobs N] [--repeat R] ...

Every system gets the same sessions, interleaved round-robin over the repeats
(the order rotates each repeat): a fresh database, K worker processes started
and warmed up, then the measurements (see `bench.measure`); then everything is
stopped and the database dropped. Figures are medians over the repeats. Ours
also gets a WORKERS sweep, the API submit measurements (`bench.submit`) and
the backlog check (`bench.backlog`), webhook jobs/s of one worker process
against a local sink (`bench.webhooks`), the scheduling and routing figures
(`bench.scheduling`: lateness of scheduled jobs, a drain over two queues) and
what heartbeats and per-type limits cost (`bench.costs`: two pairs of drains), what
concurrency keys cost and whether a key waits behind another's (`bench.keys`: a drain over
1,000 keys under KEY_CONCURRENCY, a fairness run), and what a list page and the queue
depths cost on a table of a million jobs (`bench.listing`), how soon a waiting request is
answered and what waiting costs (`bench.waiting`), and what retention costs
(`bench.retention`: drains while pruning, a table millions of jobs passed through). One
more system joins the round-robin: our drain with its features on (`bench.features`: two
queues, mixed priorities, heartbeats renewing, a type under TYPE_CONCURRENCY, retention
pruning), set against the plain drain and the peers'. A progress bar goes to stderr, the
table to stdout ending with every performance target (met, missed or not measured),
everything measured to bench-results/<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import (
    backlog,
    client,
    costs,
    features,
    keys,
    listing,
    measure,
    pg,
    pressure_report,
    procs,
    profile,
    retention,
    scheduling,
    submit,
    waiting,
    webhooks,
)
from bench.adapters.base import Adapter, Unsupported, to_the_end
from bench.adapters.ours import Ours
from bench.beacon import Receiver
from bench.procs import ROOT
from bench.progress import Progress
from bench.report import render, summarize
from bench.webhooks import cpu_seconds

PEERS = ("procrastinate", "pgqueuer")
# bench.costs: the result kind and its two runs, with the feature and without.
COST_PAIRS = (("heartbeats", ("renewing", "idle")), ("type_limits", ("limited", "unlimited")))


@dataclass
class Config:
    compare: bool = False
    jobs: int = 20_000
    repeat: int = 3
    workers: int = 50
    processes: list[int] = field(default_factory=lambda: [1, 2])
    sweep: list[int] = field(default_factory=lambda: [10, 50, 200])
    latency_samples: int = 400
    # Processes spinning on the CPU while the pickup is measured again ("with other work on
    # the machine"); 0 skips that measurement.
    pickup_load: int = 2
    e2e_jobs: int = 5_000
    concurrency: int = 16
    single_requests: int = 5_000
    batch_jobs: int = 100_000
    batch_concurrency: int = 4
    backlog: bool = True
    backlog_completed: int = 1_000_000
    backlog_pending: int = 200_000
    backlog_window: int = 20_000
    backlog_skip: int = 1_000
    claim_samples: int = 300
    claim_n: int = 10
    webhook_jobs: int = 5_000
    schedule_samples: int = 400
    schedule_polls: list[str] = field(default_factory=lambda: ["1s", "5s"])
    two_queues: bool = True
    costs: bool = True
    keys: bool = True
    fair_jobs: int = 10_000
    features: bool = True
    features_prefill: int = 100_000
    list_rows: int = 1_000_000
    list_samples: int = 200
    wait_samples: int = 1_000
    wait_clients: int = 10
    waiters: int = 1_000
    retention_prefill: int = 200_000
    retention_churn: int = 2_000_000
    retention_cycled: int = 400_000
    client_jobs: int = 100_000
    # `bench.pressure`'s three scenarios at its sizes (~25 min; `--quick`: its short phases).
    # On by default with the peers (`make bench-compare`), off without (`make bench`).
    pressure: bool = False
    pressure_quick: bool = False
    server: str = ""
    keep_logs: bool = False
    profile: bool = False
    output_dir: str = str(ROOT / "bench-results")


QUICK = {
    "jobs": 2_000,
    "repeat": 1,
    "sweep": [10, 50],
    "latency_samples": 100,
    "e2e_jobs": 500,
    "single_requests": 500,
    "batch_jobs": 10_000,
    "backlog_completed": 100_000,
    "backlog_pending": 20_000,
    "backlog_window": 2_000,
    "backlog_skip": 200,
    "claim_samples": 100,
    "webhook_jobs": 600,
    "schedule_samples": 100,
    "list_rows": 100_000,
    "list_samples": 50,
    "wait_samples": 200,
    "retention_prefill": 50_000,
    "retention_churn": 200_000,
    "retention_cycled": 100_000,
    "client_jobs": 20_000,
    "features_prefill": 50_000,
    "fair_jobs": 2_000,
}


class Interrupted(BaseException):
    """SIGINT or SIGTERM: stop after cleaning up (a BaseException, so no step records it)."""


class Run:
    """Collects raw results and errors while the sessions execute."""

    def __init__(self, config: Config, progress: Progress) -> None:
        self.config = config
        self.progress = progress
        self.workdir = Path(tempfile.mkdtemp(prefix="jobqueue-bench-"))
        self.rx: Receiver | None = None
        self.sink_url = ""
        self.results: list[dict[str, Any]] = []
        self.errors: list[dict[str, str]] = []
        self.systems: dict[str, Any] = {}
        self.interrupted = False

    def adapter(self, system: str, workers: int | None = None) -> Adapter:
        server = self.config.server
        if system == "jobqueue":
            return Ours(server, self.workdir, workers or self.config.workers)
        if system == "procrastinate":
            from bench.adapters.procrastinate_peer import Procrastinate

            return Procrastinate(server, self.workdir)
        from bench.adapters.pgqueuer_peer import PgQueuerPeer

        return PgQueuerPeer(server, self.workdir)

    async def step(self, label: str, body: Callable[[], Awaitable[None]]) -> None:
        if self.interrupted:
            raise Interrupted
        self.progress.step(label)
        try:
            await body()
        except asyncio.CancelledError:
            if self.interrupted:
                raise Interrupted from None
            raise
        except Unsupported as exc:
            self.errors.append({"step": label, "error": str(exc), "kind": "unsupported"})
        except Exception as exc:
            if self.interrupted:
                raise Interrupted from exc
            self.errors.append(
                {"step": label, "error": f"{exc!r}", "trace": traceback.format_exc()}
            )
        finally:
            self.progress.advance()

    def _on_signal(self, task: asyncio.Task[Any]) -> None:
        # Cancel what runs now; the `finally` blocks stop the services and drop the databases.
        # Only once: a second signal must not cut that clean-up short.
        if not self.interrupted:
            self.interrupted = True
            print("\ninterrupted: stopping services, dropping databases", file=sys.stderr)
            task.cancel()

    async def session(
        self, rep: int, system: str, processes: int, workers: int | None, full: bool
    ) -> None:
        """Fresh database, K warmed-up worker processes, the measurements, clean-up."""
        config = self.config
        adapter = self.adapter(system, workers)
        self.systems.setdefault(system, adapter.describe())
        assert self.rx is not None
        try:
            await adapter.prepare()
            await adapter.start_workers(processes)
            await measure.warm_up(adapter, self.rx, processes)
            figures: dict[str, Any] = {}
            if full:
                figures["pickup"] = await measure.pickup_latency(
                    adapter, self.rx, config.latency_samples
                )
                if config.pickup_load:
                    with measure.busy(config.pickup_load):
                        loaded = await measure.pickup_latency(
                            adapter, self.rx, config.latency_samples
                        )
                        if isinstance(adapter, Ours):
                            loaded["round_trip"] = await measure.round_trips(
                                adapter.url, config.latency_samples
                            )
                        # Read within the block: the spinners have run for the whole
                        # measurement, seconds, so the 1-minute average is on its way up.
                        loaded["load_average"] = measure.load_average()
                    loaded["spinners"] = config.pickup_load
                    figures["pickup_loaded"] = loaded
            # Our worker's CPU per job, which the drain with the features on is set against.
            pids = (
                profile.worker_children(adapter.worker_procs[0].pid)
                if isinstance(adapter, Ours)
                else []
            )
            cpu = cpu_seconds(pids)
            figures.update(await measure.drain(adapter, config.jobs, _timeout(config.jobs)))
            if pids:
                used = cpu_seconds(pids) - cpu
                figures["worker_cpu_us_per_job"] = used / config.jobs * 1e6
            if full:
                if isinstance(adapter, Ours) and adapter.api is None:
                    await adapter.start_api()  # not inside the measurement
                figures.update(
                    await measure.end_to_end(
                        adapter,
                        config.e2e_jobs,
                        config.concurrency,
                        _timeout(config.e2e_jobs),
                        lambda: _parts(adapter),
                    )
                )
            if full and config.profile and rep == 0 and isinstance(adapter, Ours):
                figures["profile"] = await self.profile_drain(adapter)
        finally:
            await to_the_end(adapter.cleanup())
        self.results.append(
            {
                "kind": "session",
                "repeat": rep,
                "system": system,
                "processes": processes,
                "workers": workers,
                **figures,
            }
        )

    async def profile_drain(self, adapter: Ours) -> dict[str, Any]:
        """One more drain, not measured, with py-spy attached to every worker child."""
        pids = profile.worker_children(adapter.worker_procs[0].pid)
        spies = profile.start(pids, self.workdir)
        await asyncio.sleep(1)  # attached before the jobs arrive
        try:
            await measure.drain(adapter, self.config.jobs, _timeout(self.config.jobs))
        finally:
            result = await profile.stop(spies)
        return result

    async def features_session(self, rep: int) -> None:
        c = self.config
        assert self.rx is not None
        self.systems.setdefault(features.SYSTEM, features.describe(c.workers))
        figures = await features.session(
            c.server,
            self.workdir,
            self.rx,
            c.workers,
            max(c.processes),
            c.jobs,
            c.features_prefill,
            _timeout(c.jobs),
        )
        self.results.append({**figures, "repeat": rep})

    async def api_session(self, rep: int) -> None:
        ours = Ours(self.config.server, self.workdir, self.config.workers)
        try:
            await ours.prepare()
            await ours.start_api()
            single = await submit.single(ours, self.config.single_requests, self.config.concurrency)
            self.results.append({"kind": "http_single", "repeat": rep, **single})
            batch = await submit.batch(ours, self.config.batch_jobs, self.config.batch_concurrency)
            self.results.append({"kind": "http_batch", "repeat": rep, **batch})
        finally:
            await to_the_end(ours.cleanup())

    async def webhook_session(self, rep: int) -> None:
        c = self.config
        figures = await webhooks.session(
            c.server, self.workdir, self.sink_url, c.webhook_jobs, 200, 1, webhooks.Config.workers
        )
        self.results.append({"kind": "webhooks", "repeat": rep, **figures})

    async def lateness_session(self, rep: int, poll: str) -> None:
        c = self.config
        assert self.rx is not None
        figures = await scheduling.lateness_session(
            c.server, self.workdir, self.rx, c.workers, max(c.processes), poll, c.schedule_samples
        )
        self.results.append({"kind": "lateness", "repeat": rep, **figures})

    async def two_queue_session(self, rep: int) -> None:
        c = self.config
        assert self.rx is not None
        figures = await scheduling.two_queue_session(
            c.server, self.workdir, self.rx, c.workers, max(c.processes), c.jobs, _timeout(c.jobs)
        )
        self.results.append({"kind": "two_queues", "repeat": rep, **figures})

    async def cost_session(self, rep: int, kind: str, variant: str) -> None:
        c = self.config
        assert self.rx is not None
        session = costs.heartbeat_session if kind == "heartbeats" else costs.limits_session
        figures = await session(
            c.server,
            self.workdir,
            self.rx,
            c.workers,
            max(c.processes),
            c.jobs,
            _timeout(c.jobs),
            variant,
        )
        self.results.append({"kind": kind, "repeat": rep, **figures})

    async def keys_drain_session(self, rep: int) -> None:
        c = self.config
        assert self.rx is not None
        figures = await keys.drain_session(
            c.server, self.workdir, self.rx, c.workers, max(c.processes), c.jobs, _timeout(c.jobs)
        )
        self.results.append({**figures, "repeat": rep})

    async def keys_paused_session(self, rep: int) -> None:
        c = self.config
        assert self.rx is not None
        figures = await keys.paused_session(
            c.server, self.workdir, self.rx, c.workers, max(c.processes), c.jobs, _timeout(c.jobs)
        )
        self.results.append({**figures, "repeat": rep})

    async def keys_fairness_session(self, rep: int) -> None:
        c = self.config
        assert self.rx is not None
        figures = await keys.fairness_session(c.server, self.workdir, self.rx, c.fair_jobs)
        self.results.append({**figures, "repeat": rep})

    async def listing_session(self) -> None:
        c = self.config
        self.results.append(
            await listing.session(c.server, self.workdir, c.list_rows, c.list_samples)
        )

    async def waiting_session(self) -> None:
        c = self.config
        assert self.rx is not None
        figures = await waiting.session(
            c.server,
            self.workdir,
            self.rx,
            workers=c.workers,
            processes=max(c.processes),
            clients=c.wait_clients,
            samples=c.wait_samples,
            waiters=c.waiters,
            jobs=c.jobs,
            pairs=c.repeat,
            limit=_timeout(c.jobs),
        )
        self.results.append(figures)

    async def client_session(self) -> None:
        c = self.config
        self.results.append(
            await client.session(
                c.server,
                self.workdir,
                jobs=c.client_jobs,
                clients=client.CLIENTS,
                connections=client.CONNECTIONS,
                repeat=c.repeat,
            )
        )

    async def pressure_session(self) -> None:
        """`bench.pressure`'s scenarios, each phase a step of this run's progress."""
        from bench import pressure  # it imports this module

        measured = await pressure.execute(_pressure_config(self.config), self.progress)
        self.results.append({"kind": "pressure", **measured})

    async def retention_sessions(self) -> None:
        """Pairs of drains, pruning and not, alternating; then one table `retention_churn`
        jobs pass through, measured each repeat against a fresh one."""
        c = self.config
        assert self.rx is not None
        rx = self.rx
        for rep in range(c.repeat if c.retention_prefill else 0):
            for variant in list(retention.RETENTIONS)[:: 1 if rep % 2 == 0 else -1]:

                async def pair_run(rep: int = rep, variant: str = variant) -> None:
                    figures = await retention.prune_session(
                        c.server,
                        self.workdir,
                        rx,
                        c.workers,
                        max(c.processes),
                        c.retention_prefill,
                        c.jobs,
                        _timeout(c.jobs),
                        variant,
                    )
                    self.results.append({**figures, "repeat": rep})

                await self.step(
                    f"{rep + 1}/{c.repeat} retention: drain with {c.retention_prefill:,} old "
                    f"jobs, {variant}",
                    pair_run,
                )
        if not c.retention_churn:
            return
        churned = retention.Churned(
            c.server,
            self.workdir,
            c.workers,
            max(c.processes),
            c.retention_churn,
            c.retention_cycled,
        )
        options = {
            "claim_samples": c.claim_samples,
            "claim_n": c.claim_n,
            "skip": c.backlog_skip,
            "window": c.backlog_window,
            "limit": _timeout(c.backlog_window + c.backlog_skip),
            "use": backlog.consumed(
                c.claim_samples, c.claim_n, c.backlog_skip, c.backlog_window, 2 * c.workers
            ),
        }

        async def push() -> None:
            await churned.push()
            assert churned.pushed is not None
            self.results.append({"kind": "retention_push", **churned.pushed})

        try:
            await self.step(
                f"retention: {c.retention_churn:,} jobs through one table, pruned", push
            )
            for rep in range(c.repeat):
                for table in ("fresh", "churned")[:: 1 if rep % 2 == 0 else -1]:
                    if churned.pushed is None:
                        self.progress.advance()  # the push failed, and said so
                        continue

                    async def measured(rep: int = rep, table: str = table) -> None:
                        self.results.append(await churned.measure(table, rep, options))

                    await self.step(
                        f"{rep + 1}/{c.repeat} retention: claims and drain, {table} table",
                        measured,
                    )
        finally:
            await to_the_end(churned.cleanup())

    async def backlog_sessions(self) -> None:
        """One big table kept for every repeat; a fresh empty one per repeat."""
        c = self.config
        use = backlog.consumed(
            c.claim_samples, c.claim_n, c.backlog_skip, c.backlog_window, 2 * c.workers
        )
        options = {
            "processes": max(c.processes),
            "claim_samples": c.claim_samples,
            "claim_n": c.claim_n,
            "skip": c.backlog_skip,
            "window": c.backlog_window,
            "limit": _timeout(c.backlog_window + c.backlog_skip),
        }
        full = Ours(c.server, self.workdir, c.workers)
        try:
            await self.step(
                f"backlog: writing {c.backlog_completed:,} completed + "
                f"{c.backlog_pending:,} pending rows",
                lambda: _fill(full, c.backlog_completed, max(c.backlog_pending, use)),
            )
            for rep in range(c.repeat):

                async def empty_run(rep: int = rep) -> None:
                    empty = Ours(c.server, self.workdir, c.workers)
                    try:
                        await empty.prepare()
                        await backlog.fill(empty, 0, use)
                        figures = await backlog.measure(empty, **options)
                    finally:
                        await to_the_end(empty.cleanup())
                    self.results.append(
                        {"kind": "backlog", "table": "empty", "repeat": rep, **figures}
                    )

                async def full_run(rep: int = rep) -> None:
                    # Top the backlog up to its size: earlier repeats consumed some.
                    missing = max(c.backlog_pending, use) - await backlog.pending_count(full)
                    if missing > 0:
                        await backlog.fill(full, 0, missing)
                    figures = await backlog.measure(full, **options)
                    self.results.append(
                        {"kind": "backlog", "table": "backlog", "repeat": rep, **figures}
                    )

                runs = [("empty", empty_run), ("backlog", full_run)]
                for name, body in runs if rep % 2 == 0 else runs[::-1]:
                    await self.step(f"backlog {rep + 1}/{c.repeat}: {name} table", body)
        finally:
            await to_the_end(full.cleanup())

    async def execute(self) -> None:
        c = self.config
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._on_signal, task)
        self.rx = await Receiver.open()
        sink, self.sink_url = await webhooks.open_sink()
        try:
            for name in await pg.drop_stale(c.server):
                print(f"dropped stale benchmark database {name}", file=sys.stderr)
            systems = [
                "jobqueue",
                *([features.SYSTEM] if c.features else ()),
                *(PEERS if c.compare else ()),
            ]
            for rep in range(c.repeat):
                shift = rep % len(systems)
                for system in systems[shift:] + systems[:shift]:
                    if system == features.SYSTEM:
                        await self.step(
                            f"{rep + 1}/{c.repeat} {system}: {max(c.processes)} worker process(es)",
                            lambda r=rep: self.features_session(r),
                        )
                        continue
                    for processes in c.processes:
                        # Latency and end-to-end are measured once per repeat, with the most
                        # processes: the production-like setting.
                        await self.step(
                            f"{rep + 1}/{c.repeat} {system}: {processes} worker process(es)",
                            lambda s=system, p=processes, r=rep: self.session(
                                r,
                                s,
                                p,
                                c.workers if s == "jobqueue" else None,
                                p == max(c.processes),
                            ),
                        )
                if c.two_queues:
                    # Right after the single-queue drains it is set against.
                    await self.step(
                        f"{rep + 1}/{c.repeat} jobqueue two queues, mixed priorities: "
                        f"{max(c.processes)} process(es)",
                        lambda r=rep: self.two_queue_session(r),
                    )
                if c.keys:
                    # Also right after the key-less drains it is set against.
                    await self.step(
                        f"{rep + 1}/{c.repeat} jobqueue drain over {keys.KEYS:,} keys, "
                        f"KEY_CONCURRENCY={keys.KEY_CONCURRENCY}: {max(c.processes)} process(es)",
                        lambda r=rep: self.keys_drain_session(r),
                    )
                    await self.step(
                        f"{rep + 1}/{c.repeat} jobqueue drain beside a paused queue of "
                        f"{keys.PAUSED_BACKLOG:,} jobs: {max(c.processes)} process(es)",
                        lambda r=rep: self.keys_paused_session(r),
                    )
                    await self.step(
                        f"{rep + 1}/{c.repeat} jobqueue fairness: {c.fair_jobs:,} jobs of key A, "
                        f"then {keys.B_JOBS} of key B",
                        lambda r=rep: self.keys_fairness_session(r),
                    )
                for kind, pair in COST_PAIRS if c.costs else ():
                    # The two runs of a pair back to back, the first alternating by repeat.
                    for variant in pair if rep % 2 == 0 else pair[::-1]:
                        await self.step(
                            f"{rep + 1}/{c.repeat} jobqueue cost of {kind}: {variant}",
                            lambda r=rep, k=kind, v=variant: self.cost_session(r, k, v),
                        )
                for poll in c.schedule_polls if c.schedule_samples else []:
                    await self.step(
                        f"{rep + 1}/{c.repeat} jobqueue scheduled-job lateness: "
                        f"POLL_INTERVAL={poll}",
                        lambda r=rep, p=poll: self.lateness_session(r, p),
                    )
                for workers in c.sweep:
                    if workers == c.workers:
                        continue  # measured above
                    for processes in c.processes:
                        await self.step(
                            f"{rep + 1}/{c.repeat} jobqueue WORKERS={workers}: "
                            f"{processes} process(es)",
                            lambda w=workers, p=processes, r=rep: self.session(
                                r, "jobqueue", p, w, False
                            ),
                        )
                await self.step(
                    f"{rep + 1}/{c.repeat} jobqueue-api submit",
                    lambda r=rep: self.api_session(r),
                )
                if c.webhook_jobs:
                    await self.step(
                        f"{rep + 1}/{c.repeat} jobqueue webhooks: 1 worker process",
                        lambda r=rep: self.webhook_session(r),
                    )
            if c.backlog:
                await self.backlog_sessions()
            if c.list_rows:
                await self.step(
                    f"listing: {c.list_rows:,} jobs, a page of {listing.LIMIT} per filter",
                    self.listing_session,
                )
            if c.wait_samples:
                await self.step(
                    f"waiting: {c.wait_clients} clients, {c.waiters:,} waiters, "
                    f"{c.repeat} pair(s) of drains",
                    self.waiting_session,
                )
            if c.client_jobs:
                await self.step(
                    f"client: enqueue_many and submit_many, {c.repeat} x {c.client_jobs:,} jobs",
                    self.client_session,
                )
            await self.retention_sessions()
            if c.pressure:
                await self.step(
                    "pressure: " + ", ".join(_pressure_config(c).scenarios), self.pressure_session
                )
        finally:
            sink.close()
            self.rx.close()
            if self.config.keep_logs:
                print(f"service logs kept in {self.workdir}", file=sys.stderr)
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)


async def _fill(adapter: Ours, completed: int, pending: int) -> None:
    await adapter.prepare()
    await backlog.fill(adapter, completed, pending)


def _parts(adapter: Adapter) -> dict[str, list[int]]:
    """The processes of each part of a running system, for its CPU per job end to end: ours
    (the API with any children, the worker's supervisor and children), a peer's own
    processes, PostgreSQL's (every server process: the backends and the WAL writer,
    checkpointer, autovacuum they cause), and this bench process (the clients)."""
    parts: dict[str, list[int]] = {}
    if isinstance(adapter, Ours):
        if adapter.api_proc is not None:
            parts["api"] = [adapter.api_proc.pid, *profile.children(adapter.api_proc.pid)]
        supervisor = adapter.worker_procs[0].pid
        parts["worker"] = [supervisor, *profile.worker_children(supervisor)]
    else:
        procs = getattr(adapter, "procs", [])
        parts["worker"] = [p.pid for p in procs]
    found = subprocess.run(["pgrep", "-x", "postgres"], capture_output=True, text=True)
    parts["postgres"] = [int(pid) for pid in found.stdout.split()]
    parts["bench client"] = [os.getpid()]
    return parts


def _timeout(jobs: int) -> float:
    # Generous: the slowest peer drains a few hundred jobs per second on a busy machine.
    return 120 + jobs / 20


def _pressure_config(c: Config) -> Any:
    from bench import pressure  # it imports this module

    config = pressure.Config(server=c.server)
    if c.pressure_quick:
        for key, value in pressure.QUICK.items():
            setattr(config, key, value)
    return config


def total_steps(c: Config) -> int:
    systems = 1 + (len(PEERS) if c.compare else 0)
    sweep = len([w for w in c.sweep if w != c.workers])
    per_repeat = (systems + sweep) * len(c.processes) + 1 + (1 if c.webhook_jobs else 0)
    per_repeat += int(c.features)
    per_repeat += int(c.two_queues) + (len(c.schedule_polls) if c.schedule_samples else 0)
    per_repeat += 2 * len(COST_PAIRS) if c.costs else 0
    per_repeat += 3 if c.keys else 0
    listed = 1 if c.list_rows else 0
    waited = 1 if c.wait_samples else 0
    waited += 1 if c.client_jobs else 0
    kept = (2 * c.repeat if c.retention_prefill else 0) + (
        1 + 2 * c.repeat if c.retention_churn else 0
    )
    pressed = 1 + len(pressure_report.PHASES) * len(_pressure_config(c).scenarios)
    pressed = pressed if c.pressure else 0
    return (
        c.repeat * per_repeat
        + ((1 + 2 * c.repeat) if c.backlog else 0)
        + listed
        + waited
        + kept
        + pressed
    )


async def postgres_version(server: str) -> str:
    import asyncpg

    conn = await asyncpg.connect(server)
    try:
        return str(await conn.fetchval("SHOW server_version"))
    finally:
        await conn.close()


def parse_args(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(
        prog="python -m bench.queues", description=__doc__.split("\n")[0]
    )
    d = Config()
    parser.add_argument("--compare", action="store_true", help="also Procrastinate and PgQueuer")
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--jobs", type=int, help=f"jobs per drain (default {d.jobs})")
    parser.add_argument(
        "--repeat", type=int, help=f"repeats, medians reported (default {d.repeat})"
    )
    parser.add_argument(
        "--workers", type=int, help=f"our WORKERS in the comparison (default {d.workers})"
    )
    parser.add_argument("--processes", help="worker process counts to drain with (default 1,2)")
    parser.add_argument("--sweep", help="our WORKERS values for the drain sweep, e.g. 10,50,200")
    parser.add_argument("--latency-samples", type=int)
    parser.add_argument(
        "--pickup-load",
        type=int,
        help="processes spinning on the CPU while the pickup is measured again, 0 skips it "
        f"(default {d.pickup_load})",
    )
    parser.add_argument("--e2e-jobs", type=int)
    parser.add_argument("--concurrency", type=int, help="HTTP / submit clients")
    parser.add_argument("--single-requests", type=int)
    parser.add_argument("--batch-jobs", type=int)
    parser.add_argument("--no-backlog", action="store_true", help="skip the backlog check")
    parser.add_argument("--backlog-completed", type=int)
    parser.add_argument("--backlog-pending", type=int)
    parser.add_argument("--backlog-window", type=int, help="jobs whose drain rate is compared")
    parser.add_argument("--backlog-skip", type=int, help="completions ignored as start-up")
    parser.add_argument("--claim-samples", type=int, help="single claims timed per table")
    parser.add_argument(
        "--webhook-jobs", type=int, help="webhooks per measured drain, 0 to skip (default 5000)"
    )
    parser.add_argument(
        "--schedule-samples",
        type=int,
        help=f"scheduled jobs per lateness measurement, 0 to skip (default {d.schedule_samples})",
    )
    parser.add_argument(
        "--schedule-polls",
        help="POLL_INTERVAL values the lateness is measured with (default 1s,5s)",
    )
    parser.add_argument(
        "--no-two-queues", action="store_true", help="skip the drain over two queues"
    )
    parser.add_argument(
        "--no-costs",
        action="store_true",
        help="skip the drains that measure what heartbeats and per-type limits cost",
    )
    parser.add_argument(
        "--no-keys",
        action="store_true",
        help="skip the drain over concurrency keys, the drain beside a paused queue and the"
        " fairness run",
    )
    parser.add_argument(
        "--fair-jobs",
        type=int,
        help=f"jobs of key A ahead of key B's in the fairness run (default {d.fair_jobs:,})",
    )
    parser.add_argument(
        "--no-features",
        action="store_true",
        help="skip our drain with the features on (queues, priorities, heartbeats, a type "
        "limit, retention)",
    )
    parser.add_argument(
        "--features-prefill",
        type=int,
        help="old completed jobs retention prunes during the drain with the features on "
        f"(default {d.features_prefill:,})",
    )
    parser.add_argument(
        "--list-rows",
        type=int,
        help=f"jobs in the listing table, 0 to skip (default {d.list_rows:,})",
    )
    parser.add_argument("--list-samples", type=int, help="timed pages per filter and page")
    parser.add_argument(
        "--wait-samples",
        type=int,
        help=f"GET ?wait= answers timed, 0 skips the waiting step (default {d.wait_samples:,})",
    )
    parser.add_argument(
        "--wait-clients",
        type=int,
        help=f"clients submitting and waiting (default {d.wait_clients})",
    )
    parser.add_argument(
        "--waiters", type=int, help=f"concurrent waiters on one API, 0 to skip ({d.waiters:,})"
    )
    parser.add_argument(
        "--retention-prefill",
        type=int,
        help="old completed jobs pruned during a drain, 0 skips those drains "
        f"(default {d.retention_prefill:,})",
    )
    parser.add_argument(
        "--retention-churn",
        type=int,
        help="jobs passed through one table with retention on before it is measured, 0 skips "
        f"it (default {d.retention_churn:,})",
    )
    parser.add_argument(
        "--retention-cycled",
        type=int,
        help="of those, jobs the worker runs; the others are inserted finished "
        f"(default {d.retention_cycled:,})",
    )
    parser.add_argument(
        "--client-jobs",
        type=int,
        help="jobs per run of enqueue_many and of submit_many, 0 skips them "
        f"(default {d.client_jobs:,})",
    )
    parser.add_argument(
        "--pressure",
        action=argparse.BooleanOptionalAction,
        help="the pressure scenarios of `make bench-pressure` (~25 min; short with --quick); "
        "default: on with --compare",
    )
    parser.add_argument(
        "--server",
        help="PostgreSQL maintenance URL (default $BENCH_DATABASE_URL, else the local server)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="py-spy our worker during one extra drain"
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the services' logs")
    parser.add_argument("--output-dir", help="where the JSON goes (default bench-results/)")
    args = parser.parse_args(argv)
    config = Config(compare=args.compare)
    if args.quick:
        for key, value in QUICK.items():
            setattr(config, key, value)
    for key in (
        "jobs",
        "repeat",
        "workers",
        "latency_samples",
        "pickup_load",
        "e2e_jobs",
        "concurrency",
        "single_requests",
        "batch_jobs",
        "backlog_completed",
        "backlog_pending",
        "backlog_window",
        "backlog_skip",
        "claim_samples",
        "webhook_jobs",
        "schedule_samples",
        "list_rows",
        "list_samples",
        "wait_samples",
        "wait_clients",
        "waiters",
        "retention_prefill",
        "retention_churn",
        "retention_cycled",
        "client_jobs",
        "features_prefill",
        "fair_jobs",
        "server",
        "output_dir",
    ):
        value = getattr(args, key)
        if value is not None:
            setattr(config, key, value)
    if args.sweep:
        config.sweep = _ints(args.sweep)
    if args.processes:
        config.processes = _ints(args.processes)
    if args.schedule_polls:
        config.schedule_polls = [v.strip() for v in args.schedule_polls.split(",") if v.strip()]
    if args.no_two_queues:
        config.two_queues = False
    if args.no_costs:
        config.costs = False
    if args.no_features:
        config.features = False
    if args.no_keys:
        config.keys = False
    config.pressure = args.compare if args.pressure is None else args.pressure
    config.pressure_quick = args.quick
    config.keep_logs = args.keep_logs
    config.profile = args.profile
    if config.profile and not profile.available():
        parser.error("--profile needs py-spy: run `make bench-install`")
    if args.no_backlog:
        config.backlog = False
    config.server = config.server or pg.server_url()
    if config.repeat < 1 or config.jobs < 1:
        parser.error("--repeat and --jobs must be at least 1")
    if config.keys and config.fair_jobs < 1:
        parser.error("--fair-jobs must be at least 1")
    if config.features and config.features_prefill < 1:
        parser.error("--features-prefill must be at least 1: retention needs jobs to prune")
    return config


def _code_version() -> dict[str, Any]:
    """The commit measured, and whether the services or jobcore had uncommitted changes."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD"),
        "uncommitted_changes": bool(git("status", "--porcelain", "--", "services", "shared")),
    }


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def machine(server: str) -> dict[str, object]:
    """What a run's figures depend on besides the code: the machine, Python, PostgreSQL."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "postgresql": asyncio.run(postgres_version(server)),
    }


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    if config.compare:
        try:
            import pgqueuer  # noqa: F401
            import procrastinate  # noqa: F401
        except ImportError as exc:
            print(
                f"bench-compare needs the bench extra ({exc}): run `make bench-install`",
                file=sys.stderr,
            )
            return 2
    progress = Progress(total_steps(config))
    run = Run(config, progress)
    started = datetime.now(UTC)
    try:
        asyncio.run(run.execute())
    except (KeyboardInterrupt, Interrupted, asyncio.CancelledError):
        print("interrupted: services stopped, databases dropped", file=sys.stderr)
        return 130
    finally:
        progress.close()
    document = {
        "started": started.isoformat(),
        "finished": datetime.now(UTC).isoformat(),
        "machine": machine(config.server),
        "code": _code_version(),
        "config": asdict(config) | {"server": "(omitted)"},
        "systems": run.systems,
        "results": run.results,
        "errors": run.errors,
        "process_groups": procs.STARTED,
    }
    document["summary"] = summarize(document)
    out_dir = Path(config.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(render(document))
    print(f"\nJSON: {path}")
    failed = [e for e in run.errors if e.get("kind") != "unsupported"]
    for error in run.errors:
        print(f"\n{error['step']}: {error['error']}\n{error.get('trace', '')}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"({time.monotonic() - started:.0f}s)", file=sys.stderr)
    sys.exit(code)
