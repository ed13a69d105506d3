"""Paused queues: one row per queue an operator paused (`POST /queues/{queue}/pause`), gone
when it is resumed. Workers claim nothing from a queue listed here (docs/worker.md#pausing-a-queue).

An addition: a new table, which the previous release neither reads nor writes (its workers
go on claiming from a paused queue until they are replaced).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The queue name rule of the jobs table (jobcore.schema.QUEUE_PATTERN at this revision).
_QUEUE_PATTERN = "^[a-z0-9][a-z0-9_.-]{0,62}$"


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:
        raise RuntimeError("0010 runs from jobqueue's env.py, which names the schema")
    return str(schema)


def upgrade() -> None:
    op.execute(
        f"""
        CREATE TABLE IF NOT EXISTS {_schema()}.queue_pauses (
            queue text PRIMARY KEY,
            paused_at timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT queue_pauses_queue_check CHECK (queue ~ '{_QUEUE_PATTERN}')
        )
        """
    )


def downgrade() -> None:
    op.execute(f"DROP TABLE IF EXISTS {_schema()}.queue_pauses")
