"""Lease holders and concurrency keys: the columns `leased_by` (the worker process,
`<host>:<pid>`, that holds a job's current lease; every claim writes it) and
`concurrency_key` (a job's key for fair dispatch and KEY_CONCURRENCY); the claim index with
the key in its order (per queue and priority, the keys, then each key's jobs by run_at),
`jobs_claim_key_idx`;
an index of the running keyed jobs.

Upgrades a populated table without a rewrite or a long lock: both columns are nullable (a
brief lock, given up after 5 s rather than queued behind a long transaction), the key's
CHECK is added NOT VALID and validated afterwards (a read that does not block writes), and
the indexes are built CONCURRENTLY, outside the migration's transaction.

The previous release neither reads nor writes the new columns, and claims through its own
claim index (`jobs_claim_queue_idx`), which this revision keeps for it; a later revision
drops it (docs/upgrading.md).

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

_KEY_CHECK = (
    "concurrency_key IS NULL OR (char_length(concurrency_key) BETWEEN 1 AND 255"
    " AND concurrency_key !~ '[[:cntrl:]]')"
)
# The claim index in fair-dispatch order. The previous release's (`jobs_claim_queue_idx`)
# stays: its workers claim through it until they are replaced (docs/upgrading.md).
_KEY_CLAIM = (
    "jobs_claim_key_idx",
    "(queue, priority DESC, (coalesce(concurrency_key, '')), run_at, id) WHERE status = 'pending'",
)
_KEY_RUNNING = (
    "jobs_key_running_idx",
    "(queue, concurrency_key) WHERE status = 'processing' AND concurrency_key IS NOT NULL",
)


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:
        raise RuntimeError("0011 runs from jobqueue's env.py, which names the schema")
    return str(schema)


def upgrade() -> None:
    schema = _schema()
    op.execute("SET LOCAL lock_timeout = '5s'")
    # Safe to run again after an interruption: the index builds below commit this part
    # before the revision is recorded.
    op.execute(f"ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS leased_by text")
    op.execute(
        f'ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS concurrency_key text COLLATE "C"'
    )
    op.execute(f"ALTER TABLE {schema}.jobs DROP CONSTRAINT IF EXISTS jobs_concurrency_key_check")
    op.execute(
        f"ALTER TABLE {schema}.jobs ADD CONSTRAINT jobs_concurrency_key_check"
        f" CHECK ({_KEY_CHECK}) NOT VALID"
    )
    with op.get_context().autocommit_block():
        op.execute(f"ALTER TABLE {schema}.jobs VALIDATE CONSTRAINT jobs_concurrency_key_check")
        for name, definition in (_KEY_RUNNING, _KEY_CLAIM):
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema}.{name}")  # a failed build
            op.execute(f"CREATE INDEX CONCURRENTLY {name} ON {schema}.jobs {definition}")


def downgrade() -> None:
    schema = _schema()
    with op.get_context().autocommit_block():
        for name, _ in (_KEY_CLAIM, _KEY_RUNNING):
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema}.{name}")
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(f"ALTER TABLE {schema}.jobs DROP CONSTRAINT IF EXISTS jobs_concurrency_key_check")
    op.execute(f"ALTER TABLE {schema}.jobs DROP COLUMN IF EXISTS concurrency_key")
    op.execute(f"ALTER TABLE {schema}.jobs DROP COLUMN IF EXISTS leased_by")
