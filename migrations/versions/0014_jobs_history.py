"""History apart from the live jobs: the table `jobs_history`, partitioned by `finished_at`,
for completed jobs moved out of `jobs` (`jobcore.history`).

A table that millions of jobs have passed through stays the size of its history, and
retention deleting them row by row takes minutes and leaves the space to vacuum
(docs/pressure.md). Moved here, completed jobs leave by the leaf: retention drops a
partition whole.

An addition: a new table, empty, with no leaves. This release reads it wherever it reads
finished jobs (a record, the lists, the counts, waiting, retention), and moves nothing into
it: the previous release reads `jobs` alone and would lose sight of a moved job. The move
starts with the release after this one, whose previous release is this one.

The downgrade moves any job the table holds back into `jobs` before dropping it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEXES = {
    "jobs_history_id_idx": "id",
    "jobs_history_type_idx": "type, id",
    "jobs_history_queue_idx": "queue, id",
    "jobs_history_finished_idx": "finished_at",
}


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:
        raise RuntimeError("0014 runs from jobqueue's env.py, which names the schema")
    return str(schema)


def upgrade() -> None:
    schema = _schema()
    # The columns of `jobs` as they are (names, types, collations, defaults), so a row
    # moves with every column named; no leaf yet, so the indexes cost nothing to build.
    op.execute(
        f"""
        CREATE TABLE IF NOT EXISTS {schema}.jobs_history (
            LIKE {schema}.jobs INCLUDING DEFAULTS,
            CONSTRAINT jobs_history_moved_check CHECK (
                status = 'completed' AND finished_at IS NOT NULL AND idempotency_key IS NULL)
        ) PARTITION BY RANGE (finished_at)
        """
    )
    for name, columns in _INDEXES.items():
        op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {schema}.jobs_history ({columns})")


def downgrade() -> None:
    schema = _schema()
    columns = ", ".join(
        f'"{name}"'
        for (name,) in op.get_bind().execute(
            sa.text(
                "SELECT attname FROM pg_attribute WHERE attrelid = CAST(:t AS regclass)"
                " AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
            ),
            {"t": f"{schema}.jobs"},
        )
    )
    op.execute(f"INSERT INTO {schema}.jobs ({columns}) SELECT {columns} FROM {schema}.jobs_history")
    op.execute(f"DROP TABLE IF EXISTS {schema}.jobs_history")
