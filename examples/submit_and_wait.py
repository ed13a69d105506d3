"""Submit many jobs at once with the Python client, then wait until every one has finished.

`submit_many` sends them in batches of 1,000 (one request and one statement each), every
item with an idempotency key, so a batch retried after a lost answer creates nothing twice.
The waits are long polls (`GET /jobs/{id}?wait=`), a hundred at a time.

    JOBQUEUE_URL=http://localhost:8080 .venv/bin/python examples/submit_and_wait.py --count 10000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter

from jobcore.client import AsyncClient, Job


async def main(count: int, concurrency: int) -> int:
    async with AsyncClient() as client:  # JOBQUEUE_URL, JOBQUEUE_TOKEN
        started = time.monotonic()
        results = await client.submit_many(
            {"type": "sleep", "payload": {"duration": "0s"}} for _ in range(count)
        )
        submitted = time.monotonic() - started
        created = Counter(result.status for result in results)
        print(
            f"submitted {count} jobs in {submitted:.2f}s ({count / submitted:,.0f} jobs/s): "
            f"{dict(created)}"
        )

        gate = asyncio.Semaphore(concurrency)

        async def finished(job_id: str) -> Job:
            async with gate:
                return await client.wait(job_id, timeout=600)

        jobs = await asyncio.gather(*(finished(r.id) for r in results if r.id is not None))
        elapsed = time.monotonic() - started
    statuses = Counter(job.status.value for job in jobs)
    print(f"all {len(jobs)} finished {elapsed:.2f}s after the first submit: {dict(statuses)}")
    return 0 if statuses == Counter({"completed": count}) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000, help="jobs to submit")
    parser.add_argument("--concurrency", type=int, default=100, help="waits at a time")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.count, args.concurrency)))
