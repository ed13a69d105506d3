"""KEY_CONCURRENCY's running count from a lease floor: the index `jobs_key_lease_idx`
(running jobs with a key, by queue, key and lease) in place of `jobs_key_running_idx`
(queue, key), and the function `key_rooms(queue, keys, rooms, wanted, leased_from)`, which
counts a key's running jobs from `leased_from` on.

Under a held MVCC horizon every attempt of a key that ended since the horizon was pinned
leaves a dead entry among the key's running jobs; counted through (queue, key), a claim of
the key reads them all. Every running job's lease lies at or above a floor the workers
find off the claims' path (`jobcore.floors`), so the count reads the key's entries from
there.

The release it replaces, at 0015, calls `key_rooms()` with four arguments, which stays,
and counts a key's running jobs by (queue, key), which the new index leads with: its
counts read the new index as they read the old one. Both functions take the same per-key
locks, so claimers of the two releases never count a key while the other claims it. The
new index is built, and the old one dropped, CONCURRENTLY, outside the migration's
transaction: writes go on meanwhile, and the old one goes only once the new one is there.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_RUNNING = "WHERE status = 'processing' AND concurrency_key IS NOT NULL"
_NAME = "jobs_key_lease_idx"
_DEFINITION = f"(queue, concurrency_key, locked_until) {_RUNNING}"
_OLD_NAME = "jobs_key_running_idx"
_OLD_DEFINITION = f"(queue, concurrency_key) {_RUNNING}"


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:
        raise RuntimeError("0016 runs from jobqueue's env.py, which names the schema")
    return str(schema)


def upgrade() -> None:
    schema = _schema()
    running = f"""SELECT count(*) FROM {schema}.jobs
                  WHERE status = 'processing' AND queue = q COLLATE "default"
                    AND concurrency_key = t.k COLLATE "C"
                    AND locked_until >= coalesce(leased_from, '-infinity')"""
    # As 0013's four-argument function (the same locks, the same two snapshots), counting
    # only the leases from `leased_from` on (NULL: all).
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION {schema}.key_rooms(
            q text, ks text[], rooms integer[], wanted integer, leased_from timestamptz
        ) RETURNS TABLE (k text, k_left integer)
        LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $body$
        DECLARE
            locked bigint[];
        BEGIN
            locked := ARRAY(
                SELECT t.nth FROM unnest(ks, rooms) WITH ORDINALITY AS t(k, room, nth)
                WHERE CASE WHEN t.room > ({running})
                           THEN pg_try_advisory_xact_lock(hashtext('{schema}.keys:' || q),
                                                          hashtext(t.k))
                           ELSE false END
                LIMIT wanted);
            RETURN QUERY
                SELECT t.k, greatest(t.room - ({running}), 0)::integer
                FROM unnest(ks, rooms) WITH ORDINALITY AS t(k, room, nth)
                WHERE t.nth = ANY(locked);
        END
        $body$
        """
    )
    with op.get_context().autocommit_block():
        _replace(schema, _OLD_NAME, _NAME, _DEFINITION)


def _replace(schema: str, old: str, name: str, definition: str) -> None:
    """Build index `name` (again, after a failed build), then drop `old`, if there."""
    op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema}.{name}")
    op.execute(f"CREATE INDEX CONCURRENTLY {name} ON {schema}.jobs {definition}")
    op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema}.{old}")


def downgrade() -> None:
    schema = _schema()
    with op.get_context().autocommit_block():
        _replace(schema, _NAME, _OLD_NAME, _OLD_DEFINITION)
    op.execute(
        f"DROP FUNCTION IF EXISTS {schema}.key_rooms(text, text[], integer[], integer, timestamptz)"
    )
