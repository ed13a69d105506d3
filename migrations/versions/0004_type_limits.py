"""Per-type limits (TYPE_CONCURRENCY, TYPE_RATE): a claim index by type and the rate windows.

The index is built CONCURRENTLY, outside the migration's transaction, so a
populated table keeps taking writes; the windows table is new and small.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Safe to run again after an interruption: the index build below commits this part
    # before the revision is recorded.
    op.create_table(
        "job_rate_windows",
        sa.Column("type", sa.Text, primary_key=True),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used", sa.Integer, nullable=False),
        if_not_exists=True,
    )
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS jobs_claim_type_idx")  # a failed build
        op.execute(
            "CREATE INDEX CONCURRENTLY jobs_claim_type_idx"
            " ON jobs (type, queue, priority DESC, run_at, id) WHERE status = 'pending'"
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS jobs_claim_type_idx")
    op.drop_table("job_rate_windows")
