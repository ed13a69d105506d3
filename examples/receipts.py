"""The handler of the examples' `send_receipt` jobs.

The process that enqueues a job must know its type (`jobcore.enqueue` checks it, as the
API does), and so must the worker that runs it: both import this module. For `make run`:

    JOB_HANDLERS=receipts PYTHONPATH=examples make run
"""

from __future__ import annotations

from typing import Any

from jobcore import JobContext, handler


@handler("send_receipt")
def send_receipt(payload: Any, ctx: JobContext) -> dict[str, Any]:
    # A real handler would call a mail service here; this one returns what it would send,
    # which the job keeps as its result.
    return {"to": payload["email"], "subject": f"Your order {payload['order_id']}"}
