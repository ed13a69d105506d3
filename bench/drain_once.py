"""`python -m bench.drain_once [--jobs N] [--processes P] [--workers W] [--role-settings]
[--keys K]`: one drain of N no-op jobs (key-less, or spread over K keys under
KEY_CONCURRENCY=*:2, as `bench.keys` spreads them; inserted in one transaction, rate from
its commit to the last completion) by a fresh `jobqueue-worker` of P processes × W slots,
as one JSON line: the rate and the worker processes' CPU per job.

It and its services run from the tree this module is in (its `shared/` and `services/`
first on the path), so the same command run from a `git worktree` of another commit (this
file copied there if it has none) measures that commit: the way to set two commits against
each other, runs interleaved (docs/performance.md). `--role-settings` gives the run's
database the worker's store settings (`ALTER DATABASE ... SET`, as a role of its own would
have them), so its calls need no transaction of their own for them."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

TREE = Path(__file__).resolve().parent.parent
CODE = [str(TREE / d) for d in ("shared", "services/api", "services/worker", ".")]
# This tree's modules (`run` imports them), not the installed ones.
sys.path[:0] = CODE


async def run(
    jobs: int, processes: int, workers: int, role_settings: bool, keys: int
) -> dict[str, Any]:
    # Imported here, after the path above is set: this tree's modules.
    from bench import costs
    from bench.adapters.base import to_the_end
    from bench.adapters.ours import MAX_ATTEMPTS, Ours
    from bench.adapters.ours_jobs import JOB_TYPE
    from bench.beacon import Receiver
    from bench.pg import server_url
    from jobcore.ids import new_id
    from jobcore.rows import NewJob

    class Here(Ours):
        """Our adapter, its services run from this tree's code."""

        def env(self) -> dict[str, str]:
            return {**super().env(), "PYTHONPATH": ":".join(CODE)}

    rx = await Receiver.open()
    try:
        with tempfile.TemporaryDirectory() as workdir:
            ours = Here(server_url(), Path(workdir), workers)

            async def preset() -> None:
                from jobqueue_worker.database import SETTINGS  # a tree that has them

                for name, value in SETTINGS.items():
                    await ours.sql.value(
                        f"ALTER DATABASE \"{ours.database}\" SET {name} = '{value}'"
                    )

            try:
                width = len(str(keys - 1))
                batch = [
                    NewJob(
                        new_id(),
                        JOB_TYPE,
                        {},
                        MAX_ATTEMPTS,
                        **({"concurrency_key": f"key-{i % keys:0{width}}"} if keys else {}),
                    )
                    for i in range(jobs)
                ]
                env = {"KEY_CONCURRENCY": "*:2"} if keys else {}
                # The hook only when asked for: a tree of an older commit has none.
                hook = {"before_start": preset} if role_settings else {}
                figures = await costs.drain_with_cpu(ours, rx, processes, batch, 300, env, **hook)
            finally:
                await to_the_end(ours.cleanup())
    finally:
        rx.close()
    return {
        "code": str(TREE),
        "role_settings": role_settings,
        "processes": processes,
        "workers": workers,
        "jobs": jobs,
        "keys": keys,
        "drain_jobs_per_s": round(figures["drain_jobs_per_s"]),
        "worker_cpu_us_per_job": round(figures["worker_cpu_us_per_job"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.drain_once", description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--role-settings", action="store_true")
    parser.add_argument("--keys", type=int, default=0, help="keys the jobs are spread over")
    args = parser.parse_args()
    figures = run(args.jobs, args.processes, args.workers, args.role_settings, args.keys)
    print(json.dumps(asyncio.run(figures)))


if __name__ == "__main__":
    main()
