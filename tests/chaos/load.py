"""The chaos run's client: submits a mix of jobs through both APIs while faults are injected.

Like a careful real client, it retries a submission that got no answer (or a
503) with the same Idempotency-Key and the same body, on the other API, until it
is acknowledged with 201 (created) or 200 (replayed). Every job it submits thus has an
idempotency key (the `lock_enqueue` fault replays them). Only acknowledged jobs are
owed to the client, so only they count for "never lost". Any other answer (400,
409, 500) is recorded as a failure: the requests are valid and never conflict. Every
answer of 500 or more (503 included) is recorded with its API and time
(`LoadStats.server_errors`): none is allowed during the rollout phase. The APIs it
sends to can be replaced while it runs (`use_apis`), as a load balancer's rotation
changes during a rollout; a fault can ask for cancels of its own probes through it
(`cancel_soon`), recorded like the load's own.

A sample of the load's own jobs is cancelled through the APIs as well
(`tests.chaos.canceller`): some while they run, some while they are pending.

The mix is routed: jobs go to several queues (`QUEUE_MIX`; the chaos workers
serve them all), most carry a priority, and some are scheduled a few seconds
ahead by `run_at` (with various UTC offsets) or by `delay` (seconds or a Go
duration). Each acknowledgement carries the job's due time, which no execution
may start before: the `run_at` of a 201 answer (the database's own value); for a
200 replay, whose job may have been retried (and so re-scheduled) since, a lower
bound the client knows by itself: the `run_at` it sent, or the time of its first
request plus the delay.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx

from tests.chaos.canceller import Canceller, Plan, plan
from tests.chaos.evidence import Ack, CancelRequest, ServerError, log_time
from tests.chaos.system import LEASE_SECONDS

# (kind of job, weight); `job_body` makes each kind's request.
MIX: list[tuple[str, int]] = [
    ("fast", 70),
    ("slow", 10),
    ("slow-past-lease", 3),
    ("flaky", 12),
    ("permanent", 5),
    ("long", 3),
    ("bulk", 4),
]
# Long jobs run 2-3 leases, under a timeout of their own (JOB_TIMEOUT is much shorter).
LONG_SECONDS = (2 * LEASE_SECONDS, 3 * LEASE_SECONDS)
LONG_TIMEOUT = 6 * LEASE_SECONDS
# Long jobs are drawn only for this first share of the submissions: one sent last would keep
# the run waiting for it after the faults.
LONG_UNTIL = 0.6


# Every queue here must be in the chaos workers' QUEUES (tests.chaos.system), or its jobs
# would stay pending: lost, for the checker.
QUEUE_MIX: list[tuple[str, int]] = [("default", 5), ("bulk", 3), ("urgent", 2)]
PRIORITY_SHARE = 0.6  # jobs sent with a priority (the others get the default, 0)
SCHEDULED_SHARE = 0.15  # jobs due a few seconds after their submission
SCHEDULE_AHEAD = (1.0, 5.0)  # seconds
OFFSETS = [timedelta(0), timedelta(hours=2), timedelta(hours=-5, minutes=-30)]
# Jobs sent with a concurrency key, one of a handful, so the workers' KEY_CONCURRENCY
# (tests.chaos.system.KEY_LIMIT) holds some back. The previous release's API knows no key:
# while it may answer, the key is left out (`Load.open_keys`).
KEYED_SHARE = 0.25
KEYS = ["tenant-a", "tenant-b", "tenant-c", "tenant-d"]

# How a job is scheduled: ("run_at", seconds ahead, UTC offset), ("delay", seconds, sent
# as a Go duration rather than a number?), or None (due at once). Applied when the job is
# sent, so "ahead" is of then.
Schedule = tuple[str, float, Any] | None


def route(body: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], Schedule]:
    """Give a job of the mix its queue, maybe a priority, maybe a schedule."""
    body = dict(body)
    body["queue"] = rng.choices([q for q, _ in QUEUE_MIX], [w for _, w in QUEUE_MIX])[0]
    if rng.random() < PRIORITY_SHARE:
        body["priority"] = rng.randint(-100, 100)
    if rng.random() >= SCHEDULED_SHARE:
        return body, None
    ahead = round(rng.uniform(*SCHEDULE_AHEAD), 3)
    if rng.random() < 0.5:
        return body, ("run_at", ahead, rng.choice(OFFSETS))
    return body, ("delay", ahead, rng.random() < 0.5)


def keyed(body: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Give a job of the mix a concurrency key, for KEYED_SHARE of them."""
    if rng.random() < KEYED_SHARE:
        return {**body, "concurrency_key": rng.choice(KEYS)}
    return body


def scheduled(body: dict[str, Any], schedule: Schedule, now: float) -> tuple[dict[str, Any], float]:
    """The body to send at `now` (epoch seconds) and the earliest its job may start."""
    if schedule is None:
        return body, now
    how, ahead, option = schedule
    if how == "run_at":
        at = datetime.fromtimestamp(now + ahead, timezone(option))
        text = at.isoformat(timespec="microseconds").replace("+00:00", "Z")
        # The timestamp as sent (microseconds), not now + ahead: it is what the job is due at.
        return {**body, "run_at": text}, at.timestamp()
    ms = round(ahead * 1000)
    # The database adds the delay to its now(), which comes after `now`: a lower bound.
    return {**body, "delay": f"{ms}ms" if option else ms / 1000}, now + ms / 1000


def job_body(kind: str, rng: random.Random) -> dict[str, Any]:
    if kind == "fast":
        return {"type": "chaos-fast", "payload": {"n": rng.random()}}
    if kind == "slow":
        return {"type": "chaos-slow", "payload": {"seconds": round(rng.uniform(0.3, 1.5), 2)}}
    if kind == "slow-past-lease":
        # Sleeps past the lease; JOB_TIMEOUT cuts each attempt short, then it is dead-lettered.
        return {"type": "chaos-slow", "payload": {"seconds": 10}, "max_attempts": 2}
    if kind == "long":
        seconds = round(rng.uniform(*LONG_SECONDS), 2)
        return {"type": "chaos-long", "payload": {"seconds": seconds}, "timeout": LONG_TIMEOUT}
    if kind == "flaky":
        return {"type": "chaos-flaky", "payload": {"fail_times": rng.randint(1, 2)}}
    if kind == "bulk":
        # The type the operator cancels in bulk (tests.chaos.admin).
        return {"type": "chaos-bulk", "payload": {"seconds": round(rng.uniform(0.2, 1.5), 2)}}
    if kind == "permanent":
        return {"type": "chaos-permanent", "payload": {}}
    raise ValueError(kind)


@dataclass
class LoadStats:
    acks: list[Ack] = field(default_factory=list)
    cancels: list[CancelRequest] = field(default_factory=list)
    attempts: int = 0
    retried: Counter[str] = field(default_factory=Counter)  # why a submission was sent again
    failures: list[str] = field(default_factory=list)  # answers that must never happen
    unacknowledged: int = 0
    finished_at: float | None = None
    # Every answer of 500 or more (503 included), submissions and cancels, by API and time:
    # retried, but none is allowed while the rollout phase goes on (tests.chaos.rollout).
    server_errors: list[ServerError] = field(default_factory=list)
    # Acknowledged jobs a bulk retry of dead letters may name (tests.chaos.admin).
    retryable: list[str] = field(default_factory=list)


class Load:
    """Submits `jobs` jobs spread over `spread` seconds; runs in a thread with its own loop."""

    def __init__(
        self,
        api_urls: list[str],
        jobs: int,
        spread: float,
        seed: int,
        run_id: str,
        concurrency: int = 8,
        give_up_after: float = 300.0,
        cancels: bool = True,
        keys: bool = True,
    ) -> None:
        self.api_urls = api_urls
        self.jobs = jobs
        self.spread = spread
        self.rng = random.Random(seed)
        self.run_id = run_id
        self.concurrency = concurrency
        self.give_up_after = give_up_after
        self.stats = LoadStats()
        self.cancels = cancels
        # Its own generator: the job mix of a seed stays the same whether or not it cancels.
        self.cancel_rng = random.Random(f"cancels-{seed}")
        self.key_rng = random.Random(f"keys-{seed}")  # likewise
        self.canceller = Canceller(
            api_urls,
            self._http,
            self.stats.cancels,
            self.stats.failures,
            server_errors=self.stats.server_errors,
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._client: httpx.AsyncClient | None = None
        self._done = threading.Event()
        self._keys = threading.Event()
        if keys:
            self._keys.set()
        self._serial = 0

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._run(), self._loop)

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def submit(self, body: dict[str, Any], timeout: float = 60) -> str | None:
        """Submit one more job now (thread-safe); its id once acknowledged, None if never."""
        future = asyncio.run_coroutine_threadsafe(self._submit_one(body), self._loop)
        return future.result(timeout)

    def open_keys(self) -> None:
        """Send the mix's concurrency keys from now on (thread-safe): every API knows them."""
        self._keys.set()

    def use_apis(self, api_urls: Sequence[str]) -> None:
        """Send every request from now on to these APIs (thread-safe): a load balancer's
        rotation during a rollout. Requests in flight finish where they were sent."""
        urls = list(api_urls)
        self.api_urls = urls
        self.canceller.api_urls = urls

    def cancel_soon(
        self, plan: Sequence[tuple[str, float]], mode: str
    ) -> concurrent.futures.Future[None]:
        """Ask for each job of `plan` (job id, seconds from now) to be cancelled, each request
        recorded with `mode` as the load's own are (thread-safe); done once all are answered."""

        async def ask_all() -> None:
            began = time.monotonic()

            async def one(job_id: str, after: float) -> None:
                await asyncio.sleep(max(0.0, began + after - time.monotonic()))
                await self.canceller.cancel(job_id, mode, 0.0)

            await asyncio.gather(*(one(job_id, after) for job_id, after in plan))

        return asyncio.run_coroutine_threadsafe(ask_all(), self._loop)

    def close(self) -> None:
        if self._loop.is_running():

            async def shut() -> None:
                for task in asyncio.all_tasks():
                    if task is not asyncio.current_task():
                        task.cancel()
                if self._client is not None:
                    await self._client.aclose()

            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        if not self._loop.is_running():
            self._loop.close()

    # --- inside the loop -----------------------------------------------------------

    async def _run(self) -> None:
        try:
            kinds = [k for k, _ in MIX]
            weights = [w for _, w in MIX]
            short_weights = [0 if k == "long" else w for k, w in MIX]
            bodies: list[tuple[dict[str, Any], Schedule, Plan]] = []
            retryable: list[bool] = []  # dead-lettered by design, and not cancelled one by one
            made: Counter[str] = Counter()
            for i in range(self.jobs):
                mix = weights if i < self.jobs * LONG_UNTIL else short_weights
                kind = self.rng.choices(kinds, mix)[0]
                body, schedule = route(job_body(kind, self.rng), self.rng)
                cancel = plan(kind, body, schedule is not None, self.cancel_rng, made[kind])
                made[kind] += 1
                body = keyed(body, self.key_rng)
                bodies.append((body, schedule, cancel if self.cancels else None))
                retryable.append(kind == "slow-past-lease" and bodies[-1][2] is None)
            queue: asyncio.Queue[tuple[int, tuple[dict[str, Any], Schedule, Plan]]]
            queue = asyncio.Queue()
            for item in enumerate(bodies):
                queue.put_nowait(item)
            started = time.monotonic()
            cancels: list[asyncio.Task[None]] = []

            async def sender() -> None:
                while not queue.empty():
                    i, (body, schedule, cancel) = queue.get_nowait()
                    due = started + self.spread * i / max(1, self.jobs)
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                    job_id = await self._submit_one(body, schedule)
                    if job_id is not None and retryable[i]:
                        self.stats.retryable.append(job_id)
                    if job_id is not None and cancel is not None:
                        ask = self.canceller.cancel(job_id, *cancel)
                        cancels.append(asyncio.create_task(ask))

            await asyncio.gather(*(sender() for _ in range(self.concurrency)))
            await asyncio.gather(*cancels)
        finally:
            self.stats.finished_at = time.time()
            self._done.set()

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=10.0)
        return self._client

    async def _submit_one(self, body: dict[str, Any], schedule: Schedule = None) -> str | None:
        client = self._http()
        self._serial += 1
        key = f"{self.run_id}-{self._serial}"
        if "concurrency_key" in body and not self._keys.is_set():
            body = {k: v for k, v in body.items() if k != "concurrency_key"}
        # Fixed before the first request: a retry sends the very same body.
        body, earliest = scheduled(body, schedule, time.time())
        give_up = time.monotonic() + self.give_up_after
        attempt = 0
        serial = self._serial
        while time.monotonic() < give_up:
            urls = self.api_urls  # one rotation for both reads (use_apis may replace it)
            url = urls[(serial + attempt) % len(urls)]
            attempt += 1
            self.stats.attempts += 1
            try:
                response = await client.post(
                    f"{url}/jobs", json=body, headers={"Idempotency-Key": key}
                )
            except httpx.HTTPError as exc:
                self.stats.retried[type(exc).__name__] += 1
                await asyncio.sleep(0.2)
                continue
            answered = time.time()
            if response.status_code >= 500:
                self.stats.server_errors.append(
                    ServerError(url, answered, response.status_code, "POST /jobs")
                )
            if response.status_code in (200, 201):
                answer = response.json()
                job_id = str(answer["id"])
                due = earliest
                if response.status_code == 201 and answer.get("run_at"):
                    due = log_time(answer["run_at"])
                self.stats.acks.append(
                    Ack(
                        key,
                        job_id,
                        response.status_code,
                        due,
                        schedule is not None,
                        api=url,
                        answered_at=answered,
                        queue=body.get("queue", "default"),
                        concurrency_key=body.get("concurrency_key"),
                    )
                )
                return job_id
            if response.status_code == 503:
                self.stats.retried["503"] += 1
                await asyncio.sleep(0.2)
                continue
            self.stats.failures.append(
                f"POST /jobs answered {response.status_code}: {response.text[:200]}"
            )
            return None
        self.stats.unacknowledged += 1
        return None
