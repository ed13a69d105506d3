"""The run's record of what retention deleted: a trigger in the run's own database copies
every row deleted from `jobs` into `chaos_pruned`, inside the deleting statement.

The copy commits exactly when the delete does, with that statement's now() (the clock
retention measured the job's age by) and the session's application_name (who deleted
it). The checker (`tests.chaos.check_retention`) accounts for a missing acknowledged job
only through its copy. The trigger is statement-level, reading the deleted rows as a
transition table, so a prune of thousands of rows costs one insert statement.
"""

from __future__ import annotations

from typing import Any, Protocol

import psycopg

from tests.chaos.evidence import JobRow, Pruned

INSTALL = """
CREATE TABLE public.chaos_pruned (
    id uuid NOT NULL,
    type text NOT NULL,
    status text NOT NULL,
    attempts integer NOT NULL,
    max_attempts integer NOT NULL,
    lease_token bigint NOT NULL,
    idempotency_key text,
    queue text NOT NULL,
    finished_at timestamptz,
    pruned_at timestamptz NOT NULL,
    pruned_by text NOT NULL
);
CREATE FUNCTION chaos_record_pruned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.chaos_pruned
    SELECT id, type, status, attempts, max_attempts, lease_token, idempotency_key, queue,
           finished_at, now(), current_setting('application_name')
    FROM gone;
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_record_pruned AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION chaos_record_pruned();
"""

SELECT = (
    "SELECT id, type, status, attempts, max_attempts, lease_token, idempotency_key, queue,"
    " extract(epoch FROM finished_at), extract(epoch FROM pruned_at), pruned_by"
    " FROM chaos_pruned"
)


class Queries(Protocol):
    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]: ...


def install(conn: psycopg.Connection) -> None:
    # `jobs` wherever the migrating release put it: jobqueue's schema, or (a release before
    # 0008) public, from where 0008 moves it with its triggers. The audit table stays in
    # public, where every session's default search_path finds it.
    conn.execute("SET search_path TO jobqueue, public")
    try:
        conn.execute(INSTALL)
    finally:
        conn.execute("RESET search_path")


def pruned(db: Queries) -> list[Pruned]:
    """Every job row deleted so far, as it was deleted."""
    return [
        Pruned(
            JobRow(
                str(r[0]), r[1], r[2], r[3], r[4], r[5], r[6], queue=r[7],
                finished_at=None if r[8] is None else float(r[8]),
            ),
            float(r[9]),
            r[10],
        )
        for r in db.query(SELECT)
    ]  # fmt: skip


def count(db: Queries, ids: list[str]) -> int:
    """How many of the jobs `ids` have been deleted."""
    ((n,),) = db.query("SELECT count(*) FROM chaos_pruned WHERE id = ANY(%s::uuid[])", (ids,))
    return int(n)
