"""Transactional enqueue: an order and the job that mails its receipt, written in one
database transaction with SQLAlchemy. The receipt job exists (and a worker hears of it)
only when the order's transaction commits; when the order fails, its job goes with it.

With the API and a worker running, both with `JOB_HANDLERS=receipts` (for `make run`:
`JOB_HANDLERS=receipts PYTHONPATH=examples make run`):

    DATABASE_URL=postgresql://localhost:5432/jobqueue JOBQUEUE_URL=http://localhost:8080 \\
        .venv/bin/python examples/order_with_receipt.py
"""

from __future__ import annotations

import asyncio
import os
import sys
from uuid import UUID

import receipts  # noqa: F401  (registers `send_receipt` in this process: enqueue checks it)
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from jobcore import enqueue
from jobcore.client import AsyncClient, NotFound

metadata = sa.MetaData()
orders = sa.Table(
    "example_orders",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("email", sa.Text, nullable=False),
    sa.Column("total_cents", sa.Integer, nullable=False),
)


class PaymentDeclined(Exception):
    pass


async def place_order(engine: AsyncEngine, email: str, cents: int, paid: bool) -> UUID:
    """Insert the order and enqueue its receipt in one transaction; returns the job's id."""
    async with engine.begin() as conn:
        order_id = (
            await conn.execute(
                orders.insert().values(email=email, total_cents=cents).returning(orders.c.id)
            )
        ).scalar_one()
        job_id = await enqueue(conn, "send_receipt", {"order_id": order_id, "email": email})
        if not paid:
            # Anything that fails before the commit rolls back the order and its job alike.
            raise PaymentDeclined(job_id)
    return job_id


async def main() -> int:
    url = os.environ.get("DATABASE_URL", "postgresql://localhost:5432/jobqueue")
    engine = create_async_engine(url.replace("postgresql://", "postgresql+asyncpg://", 1))
    try:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
        job_id = await place_order(engine, "ada@example.com", 4200, paid=True)
        print(f"order placed; receipt job {job_id} enqueued in the same transaction")
        try:
            await place_order(engine, "bob@example.com", 990, paid=False)
        except PaymentDeclined as declined:
            lost_id = declined.args[0]
            print(f"payment declined: the order and its receipt job {lost_id} were rolled back")
    finally:
        await engine.dispose()

    async with AsyncClient() as client:  # JOBQUEUE_URL, JOBQUEUE_TOKEN
        job = await client.wait(job_id, timeout=60)
        print(f"receipt job {job.id}: {job.status.value}, result {job.result}")
        try:
            await client.get(lost_id)
            print(f"job {lost_id} exists, but its order was rolled back")
            return 1
        except NotFound:
            print(f"job {lost_id} does not exist, as its order does not")
    return 0 if job.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
