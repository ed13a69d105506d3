"""Lease holders: the column `leased_by`, the worker process (`<host>:<pid>`) that holds a
job's current lease, which every claim writes and the dashboard's job page shows.

An addition: a nullable column (no rewrite; a brief lock, given up after 5 s rather than
queued behind a long transaction). The previous release neither reads nor writes it; jobs its
workers claim show no holder until one of this release's workers claims them.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:
        raise RuntimeError("0011 runs from jobqueue's env.py, which names the schema")
    return str(schema)


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(f"ALTER TABLE {_schema()}.jobs ADD COLUMN IF NOT EXISTS leased_by text")


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(f"ALTER TABLE {_schema()}.jobs DROP COLUMN IF EXISTS leased_by")
