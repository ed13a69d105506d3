"""A key's room under KEY_CONCURRENCY, counted without a queue-wide lock: the function
`key_room(queue, key, room)`, which the claims call for each key they are about to take
jobs of.

It takes the key's own transaction-scoped advisory lock without waiting (another claimer
taking jobs of the same key right now holds it: then the key has no room for this claim),
and once it has the lock counts the key's running jobs in a snapshot of its own, taken
after the lock, so it sees every claim of the key that committed before. The calling
claim holds the queue's KEY_CONCURRENCY lock in shared mode, which keeps it apart from
the claimers that still take that lock exclusively (the claim under per-type limits, and
the previous release's claims during a rollout).

An addition: a new function, which the previous release does not call.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:
        raise RuntimeError("0012 runs from jobqueue's env.py, which names the schema")
    return str(schema)


def upgrade() -> None:
    schema = _schema()
    # VOLATILE: each statement of the body takes a snapshot of its own (READ COMMITTED),
    # so the count runs in one taken after the lock.
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION {schema}.key_room(q text, k text, room integer)
        RETURNS integer LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $body$
        DECLARE
            left_ integer;
        BEGIN
            -- A key at its limit has no room whoever holds its lock: no lock taken for it.
            SELECT room - count(*) INTO left_ FROM {schema}.jobs
            WHERE status = 'processing' AND queue = q COLLATE "default"
              AND concurrency_key = k COLLATE "C";
            IF left_ <= 0 THEN
                RETURN 0;
            END IF;
            IF NOT pg_try_advisory_xact_lock(hashtext('{schema}.keys:' || q), hashtext(k)) THEN
                RETURN 0;
            END IF;
            RETURN greatest(room - (
                SELECT count(*) FROM {schema}.jobs
                WHERE status = 'processing' AND queue = q COLLATE "default"
                  AND concurrency_key = k COLLATE "C"), 0);
        END
        $body$
        """
    )


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {_schema()}.key_room(text, text, integer)")
