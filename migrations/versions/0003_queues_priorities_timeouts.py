"""Queues, priorities and per-job timeouts; the claim index in the new claim order.

Upgrades a populated table without a rewrite or a long lock: the new columns
have constant defaults (stored in the catalogue, not in every row), their CHECK
constraints are added NOT VALID and validated afterwards (which reads the table
without blocking writes), and the new claim index is built CONCURRENTLY before
the old one is dropped the same way, outside the migration's transaction.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CHECKS = {
    "jobs_queue_check": "queue ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'",
    "jobs_priority_check": "priority BETWEEN -100 AND 100",
    "jobs_timeout_check": "timeout IS NULL OR timeout BETWEEN 1 AND 86400",
}


def upgrade() -> None:
    # A brief ACCESS EXCLUSIVE lock for the new columns: give up rather than queue behind a
    # long transaction (every later query on the table would queue behind this); run again.
    op.execute("SET LOCAL lock_timeout = '5s'")
    # Safe to run again after an interruption: the index build below commits this part
    # before the revision is recorded.
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS queue text NOT NULL DEFAULT 'default'")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS timeout double precision")
    for name, condition in _CHECKS.items():
        op.execute(f"ALTER TABLE jobs DROP CONSTRAINT IF EXISTS {name}")
        op.execute(f"ALTER TABLE jobs ADD CONSTRAINT {name} CHECK ({condition}) NOT VALID")
    with op.get_context().autocommit_block():
        for name in _CHECKS:
            op.execute(f"ALTER TABLE jobs VALIDATE CONSTRAINT {name}")
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS jobs_claim_queue_idx")  # a failed build
        op.execute(
            "CREATE INDEX CONCURRENTLY jobs_claim_queue_idx"
            " ON jobs (queue, priority DESC, run_at, id) WHERE status = 'pending'"
        )
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS jobs_claim_idx")


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS jobs_claim_idx")
        op.execute(
            "CREATE INDEX CONCURRENTLY jobs_claim_idx ON jobs (run_at, id) WHERE status = 'pending'"
        )
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS jobs_claim_queue_idx")
    for name in _CHECKS:
        op.drop_constraint(name, "jobs", type_="check")
    op.drop_column("jobs", "timeout")
    op.drop_column("jobs", "priority")
    op.drop_column("jobs", "queue")
