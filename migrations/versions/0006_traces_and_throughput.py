"""Trace context carried with a job, and an index of jobs by when they finished.

`traceparent` (W3C Trace Context) is the submitting request's span, stored so the attempt's
span can link to it; NULL when tracing is off, so the column costs no row any bytes.
`jobs_finished_idx` answers "how many jobs finished per minute over the last hour" (the
dashboard's throughput chart) as a range read of that hour alone. The column is nullable
(no rewrite) and the index is built CONCURRENTLY, outside the migration's transaction.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Safe to run again after an interruption: the index build commits this part first.
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS traceparent text")
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_idx")  # a failed build
        op.execute(
            "CREATE INDEX CONCURRENTLY jobs_finished_idx"
            " ON jobs (finished_at) WHERE finished_at IS NOT NULL"
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_idx")
    op.drop_column("jobs", "traceparent")
