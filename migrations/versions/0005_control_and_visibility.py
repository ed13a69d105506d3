"""Cancel, results, waiting, listing and retention: the `cancelled` status, the columns
`result`, `cancel_requested_at`, `finished_at` and `awaited`, the list indexes and the
maintenance leases.

Upgrades a populated table without a rewrite or a long lock: the new columns are
nullable or have a constant default (stored in the catalogue, not in every row), the
widened status check is added NOT VALID and validated afterwards (a read that does
not block writes), and the indexes are built CONCURRENTLY, outside the migration's
transaction. Jobs that had already finished get `finished_at` from `updated_at` (the
time of their last transition), in batches of 5,000 rows, so retention can age them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_STATUSES = "'pending', 'processing', 'completed', 'failed', 'dead_letter'"
_NEW_STATUSES = _OLD_STATUSES + ", 'cancelled'"
_FINISHED = ("completed", "failed", "dead_letter")  # those that existed before this revision
_LIST_INDEXES = {
    "jobs_status_idx": "status, id",
    "jobs_type_idx": "type, status, id",
    "jobs_queue_idx": "queue, status, id",
}
_BATCH = 5000


def upgrade() -> None:
    # A brief ACCESS EXCLUSIVE lock for the new columns: give up rather than queue behind a
    # long transaction (every later query on the table would queue behind this); run again.
    op.execute("SET LOCAL lock_timeout = '5s'")
    # Safe to run again after an interruption: the index builds below commit this part
    # before the revision is recorded.
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS result jsonb")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS cancel_requested_at timestamptz")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS finished_at timestamptz")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS awaited boolean NOT NULL DEFAULT false")
    op.execute("ALTER TABLE jobs DROP CONSTRAINT IF EXISTS jobs_status_check")
    op.execute(
        f"ALTER TABLE jobs ADD CONSTRAINT jobs_status_check CHECK (status IN ({_NEW_STATUSES}))"
        " NOT VALID"
    )
    op.create_table(
        "maintenance_leases",
        sa.Column("task", sa.Text, primary_key=True),
        sa.Column("holder", sa.Uuid, nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        if_not_exists=True,
    )
    with op.get_context().autocommit_block():
        op.execute("ALTER TABLE jobs VALIDATE CONSTRAINT jobs_status_check")
        for name, columns in _LIST_INDEXES.items():
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")  # a failed build
            op.execute(
                f"CREATE INDEX CONCURRENTLY {name} ON jobs ({columns}) WHERE status <> 'processing'"
            )
        _backfill_finished_at()


def _backfill_finished_at() -> None:
    """finished_at = updated_at for jobs that had finished, in short transactions."""
    bind = op.get_bind()
    for status in _FINISHED:
        last = None
        while True:
            last = bind.execute(
                sa.text(
                    f"""
WITH batch AS (
    SELECT id FROM jobs
    WHERE status = '{status}' AND (CAST(:last AS uuid) IS NULL OR id > CAST(:last AS uuid))
    ORDER BY id LIMIT {_BATCH}
), done AS (
    UPDATE jobs SET finished_at = updated_at
    WHERE id IN (SELECT id FROM batch) AND finished_at IS NULL
)
SELECT max(id::text) FROM batch"""
                ),
                {"last": last},
            ).scalar()
            if last is None:
                break


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    # Cancelled jobs have no place in the older state machine: they count as failed there.
    op.execute(
        "UPDATE jobs SET status = 'failed', last_error = coalesce(last_error, 'cancelled')"
        " WHERE status = 'cancelled'"
    )
    op.execute("ALTER TABLE jobs DROP CONSTRAINT jobs_status_check")
    op.execute(
        f"ALTER TABLE jobs ADD CONSTRAINT jobs_status_check CHECK (status IN ({_OLD_STATUSES}))"
    )
    op.drop_table("maintenance_leases")
    with op.get_context().autocommit_block():
        for name in _LIST_INDEXES:
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    for column in ("awaited", "finished_at", "cancel_requested_at", "result"):
        op.drop_column("jobs", column)
