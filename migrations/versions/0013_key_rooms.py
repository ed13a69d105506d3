"""The rooms of many keys under KEY_CONCURRENCY in one call: the function
`key_rooms(queue, keys, rooms, wanted)`, which a claim calls once for the keys it is about
to take jobs of, where it called `key_room()` once a key.

Of the keys, in order, it locks the first `wanted` that have room (each key's own
transaction-scoped advisory lock, taken without waiting: a key another claimer is taking
jobs of right now has no room for this claim; a key at its limit is not locked), then
counts the running jobs of the keys it locked in a snapshot of its own, taken after every
lock, so it sees every claim of them that committed before. One call holds two statements
whatever the number of keys, where `key_room()` ran three per key.

An addition: a new function, which the previous release does not call. It locks the same
advisory locks as `key_room()`, which that release calls, so claimers of both releases
count a key under the same lock. `key_room()` stays for that release; a later revision
drops it (docs/upgrading.md).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:
        raise RuntimeError("0013 runs from jobqueue's env.py, which names the schema")
    return str(schema)


def upgrade() -> None:
    schema = _schema()
    running = f"""SELECT count(*) FROM {schema}.jobs
                  WHERE status = 'processing' AND queue = q COLLATE "default"
                    AND concurrency_key = t.k COLLATE "C\""""
    # VOLATILE: each statement of the body takes a snapshot of its own (READ COMMITTED),
    # so the second counts in one taken after the first took its locks. The CASE keeps
    # the lock behind the count (the planner orders plain conditions by their cost); no
    # ORDER BY, which would take every key's lock before the LIMIT: unnest gives the keys
    # in order.
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION {schema}.key_rooms(
            q text, ks text[], rooms integer[], wanted integer
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


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {_schema()}.key_rooms(text, text[], integer[], integer)")
