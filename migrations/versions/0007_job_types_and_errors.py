"""What the workers serve, and why each attempt failed.

`job_types` is written by the workers: one row per type some worker has a handler for, with
that handler's options (the defaults a create request that omits them gets) and the type's
periodic schedules, refreshed while a worker serves it. The API accepts a type recorded here
without importing any handler code.
`jobs.errors` keeps the failed attempts (attempt, at, error, traceback), oldest first, the
last 20. Both are additions: a new table and a nullable column (no rewrite); the previous
release neither reads nor writes them.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS errors jsonb")
    op.execute(
        """
        CREATE TABLE job_types (
            type text PRIMARY KEY,
            options jsonb NOT NULL DEFAULT '{}'::jsonb,
            schedules jsonb NOT NULL DEFAULT '[]'::jsonb,
            recorded_by text NOT NULL,
            recorded_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS job_types")
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("ALTER TABLE jobs DROP COLUMN IF EXISTS errors")
