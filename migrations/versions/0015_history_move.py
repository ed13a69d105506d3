"""The move of completed jobs into `jobs_history` starts: the index it finds them through,
`jobs_movable_idx` (completed jobs without an idempotency key, by `finished_at`).

This release's workers move those jobs out of `jobs` as they finish (`jobcore.history`).
The release it replaces, at 0014, reads `jobs_history` wherever it reads finished jobs, so
no service loses sight of a moved job during the rollout.

Built CONCURRENTLY, outside the migration's transaction: writes go on meanwhile.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAME = "jobs_movable_idx"
_DEFINITION = "(finished_at) WHERE status = 'completed' AND idempotency_key IS NULL"


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:
        raise RuntimeError("0015 runs from jobqueue's env.py, which names the schema")
    return str(schema)


def upgrade() -> None:
    schema = _schema()
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema}.{_NAME}")  # a failed build
        op.execute(f"CREATE INDEX CONCURRENTLY {_NAME} ON {schema}.jobs {_DEFINITION}")


def downgrade() -> None:
    schema = _schema()
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema}.{_NAME}")
