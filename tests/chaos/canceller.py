"""The chaos client's cancels: it asks the APIs to cancel a sample of its own jobs while the
faults go on, and records every request with its answer and times.

Which jobs, and when (`plan`), about 5 % of the mix:

- `running`: jobs long enough to be caught running (every third long job of 2-3 leases,
  from the second on, so the first always runs to its end; and a share of the slow ones
  and of those that sleep past JOB_TIMEOUT). The client reads the job's status until it
  is processing (or finished), waits a moment into the attempt, then asks: mostly 202,
  or 409 if the job finished first;
- `pending`: jobs scheduled seconds ahead, asked at once after their acknowledgement:
  mostly 200, cancelled before they ever run;
- `race`: jobs due at once, asked at once: pending, just claimed or done (200, 202 or
  409), whichever the race gives.

Like the submissions, a request that got no answer, or a 503, is sent again (to the other
API) until one of 200, 202, 404 or 409 comes back, for up to a minute; each is a request
of its own for the checker, since an unanswered one may have applied. Any other answer is
a failure of the run. Only the load's own jobs are cancelled, never a fault's probe.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.chaos.evidence import CancelRequest, ServerError

# The share of each kind of the mix asked to be cancelled while it runs; of the long jobs,
# every LONG_EVERY-th from the second on.
RUNNING_SHARE = {"slow": 0.1, "slow-past-lease": 0.2}
LONG_EVERY = 3
PENDING_SHARE = 0.1  # of the other scheduled jobs
RACE_SHARE = 0.02  # of the other jobs
# How long the client waits to see a job running before it asks anyway.
RUNNING_WAIT = 30.0
STATUS_POLL = 0.1
FINISHED = ("completed", "failed", "dead_letter", "cancelled")
DEFINITIVE = (200, 202, 404, 409)

# (mode, seconds to wait into the attempt) or None: not cancelled.
Plan = tuple[str, float] | None


def plan(
    kind: str, body: dict[str, Any], scheduled: bool, rng: random.Random, nth: int = 0
) -> Plan:
    """Whether (and how) the client will cancel a job of the mix, drawn when it is made;
    `nth`: how many jobs of its kind the mix has made before it."""
    if kind == "long":
        return ("running", round(rng.uniform(0.5, 4.0), 2)) if nth % LONG_EVERY == 1 else None
    share = RUNNING_SHARE.get(kind)
    if share is not None:
        if rng.random() >= share:
            return None
        if kind == "slow":
            return "running", round(rng.uniform(0, body["payload"]["seconds"] / 2), 2)
        return "running", round(rng.uniform(0, 1.5), 2)
    if scheduled:
        return ("pending", 0.0) if rng.random() < PENDING_SHARE else None
    return ("race", 0.0) if rng.random() < RACE_SHARE else None


class Canceller:
    """Sends the cancels of one run on the load's event loop and HTTP client."""

    def __init__(
        self,
        api_urls: list[str],
        http: Callable[[], httpx.AsyncClient],
        requests: list[CancelRequest],
        failures: list[str],
        give_up_after: float = 60.0,
        server_errors: list[ServerError] | None = None,
    ) -> None:
        self.api_urls = api_urls  # replaced as a whole (Load.use_apis), never changed
        self.http = http
        self.requests = requests
        self.failures = failures
        self.give_up_after = give_up_after
        self.server_errors = server_errors if server_errors is not None else []
        self._serial = 0

    async def cancel(self, job_id: str, mode: str, into: float) -> None:
        """Cancel `job_id` now, or `into` seconds after it is seen running (`running`)."""
        try:
            if mode == "running" and await self._until_running(job_id):
                await asyncio.sleep(into)  # a moment into the attempt: part of the plan
            await self._ask(job_id, mode)
        except Exception as exc:  # e.g. an answer that is not the job: the run must fail
            self.failures.append(f"cancel of job {job_id} failed: {exc!r}")

    async def _until_running(self, job_id: str) -> bool:
        """Poll the job's status until it is processing (True) or finished, at most
        RUNNING_WAIT."""
        deadline = time.monotonic() + RUNNING_WAIT
        attempt = 0
        while time.monotonic() < deadline:
            urls = self.api_urls
            url = urls[attempt % len(urls)]
            attempt += 1
            try:
                response = await self.http().get(f"{url}/jobs/{job_id}/status")
                status = response.json().get("status") if response.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                status = None
            if status == "processing":
                return True
            if status in FINISHED:
                return False
            await asyncio.sleep(STATUS_POLL)
        return False

    async def _ask(self, job_id: str, mode: str) -> None:
        self._serial += 1
        serial = self._serial
        give_up = time.monotonic() + self.give_up_after
        attempt = 0
        while time.monotonic() < give_up:
            urls = self.api_urls
            url = urls[(serial + attempt) % len(urls)]
            attempt += 1
            sent = time.time()
            try:
                response = await self.http().post(f"{url}/jobs/{job_id}/cancel")
            except httpx.HTTPError:
                self.requests.append(CancelRequest(job_id, sent, None, None, mode=mode))
                await asyncio.sleep(0.2)
                continue
            answered = time.time()
            code = response.status_code
            if code >= 500:
                self.server_errors.append(
                    ServerError(url, answered, code, f"POST /jobs/{job_id}/cancel")
                )
            attempts = None
            if code in (200, 202):
                attempts = int(response.json()["attempts"])
            self.requests.append(CancelRequest(job_id, sent, answered, code, attempts, mode))
            if code in DEFINITIVE:
                return
            if code != 503:
                self.failures.append(
                    f"POST /jobs/{job_id}/cancel answered {code}: {response.text[:200]}"
                )
                return
            await asyncio.sleep(0.2)
