"""jobcore.client: the jobqueue API from Python (`Client`, `AsyncClient`) and the `jobqueue`
command line (`jobcore.client.cli`). See docs/client.md.

    from jobcore.client import Client

    with Client() as client:                 # JOBQUEUE_URL, JOBQUEUE_TOKEN
        job = client.submit("send_email", {"to": "ada@example.com"}, queue="mail")
        done = client.wait(job.id, timeout=60)

It needs only httpx: no database driver, no SQLAlchemy.
"""

from jobcore.client.aio import AsyncClient
from jobcore.client.calls import MAX_BATCH
from jobcore.client.errors import (
    ClientError,
    Conflict,
    Invalid,
    NotFound,
    RateLimited,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from jobcore.client.records import FailedAttempt, Job, QueueDepth, Submitted
from jobcore.client.retries import Retries
from jobcore.client.sync import Client

__all__ = [
    "MAX_BATCH",
    "AsyncClient",
    "Client",
    "ClientError",
    "Conflict",
    "FailedAttempt",
    "Invalid",
    "Job",
    "NotFound",
    "QueueDepth",
    "RateLimited",
    "Retries",
    "Submitted",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
]
