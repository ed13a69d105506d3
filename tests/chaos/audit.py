"""The run's record of what retention deleted: a trigger in the run's own database copies
every row deleted from `jobs` or `jobs_history` into `chaos_pruned`, inside the deleting
statement, and an event trigger copies a leaf of `jobs_history` before a DROP removes it.

The copy commits exactly when the delete does, with that statement's now() (the clock
retention measured the job's age by) and the session's application_name (who deleted
it). The checker (`tests.chaos.check_retention`) accounts for a missing acknowledged job
only through its copy. The trigger is statement-level, reading the deleted rows as a
transition table, so a prune of thousands of rows costs one insert statement. A job that
a worker moved from `jobs` to `jobs_history` (deleted and inserted by one statement, whose
effects the trigger sees) was not deleted, and is not copied. `jobs_history` comes with a
revision the run may apply after this is installed: an event trigger puts the trigger on
it as it is created. `RETAINED` reads both tables, once the second exists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import psycopg

from tests.chaos.evidence import JobRow, Pruned

_COPY = (
    "SELECT id, type, status, attempts, max_attempts, lease_token, idempotency_key, queue,"
    " finished_at, now(), current_setting('application_name')"
)
# The same, inside a string literal of the trigger functions' dynamic SQL.
_COPY_QUOTED = _COPY.replace("'", "''")
INSTALL = f"""
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
CREATE FUNCTION public.chaos_record_pruned() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    history text := format('%I.jobs_history', TG_TABLE_SCHEMA);
BEGIN
    IF TG_TABLE_NAME = 'jobs' AND to_regclass(history) IS NOT NULL THEN
        EXECUTE format('INSERT INTO public.chaos_pruned {_COPY_QUOTED} FROM gone'
                       ' WHERE NOT EXISTS (SELECT 1 FROM %s AS h WHERE h.id = gone.id)',
                       history);
    ELSE
        INSERT INTO public.chaos_pruned {_COPY} FROM gone;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_record_pruned AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION chaos_record_pruned();
CREATE FUNCTION public.chaos_watch_history() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE
    made record;
BEGIN
    FOR made IN SELECT * FROM pg_event_trigger_ddl_commands()
                WHERE command_tag = 'CREATE TABLE' AND object_identity ~ '[.]jobs_history$'
    LOOP
        EXECUTE format('CREATE TRIGGER chaos_record_pruned AFTER DELETE ON %s'
                       ' REFERENCING OLD TABLE AS gone FOR EACH STATEMENT'
                       ' EXECUTE FUNCTION public.chaos_record_pruned()', made.object_identity);
    END LOOP;
END $$;
CREATE EVENT TRIGGER chaos_watch_history ON ddl_command_end WHEN TAG IN ('CREATE TABLE')
    EXECUTE FUNCTION public.chaos_watch_history();
CREATE FUNCTION public.chaos_record_dropped() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE
    leaf text := substring(current_query() FROM
                           '(?i)DROP TABLE ([a-z0-9_."]+[.]jobs_history_[0-9]{{8}}t[0-9_t]+)');
BEGIN
    IF leaf IS NOT NULL AND to_regclass(leaf) IS NOT NULL THEN
        EXECUTE format('INSERT INTO public.chaos_pruned {_COPY_QUOTED} FROM %s', leaf);
    END IF;
END $$;
CREATE EVENT TRIGGER chaos_record_dropped ON ddl_command_start WHEN TAG IN ('DROP TABLE')
    EXECUTE FUNCTION public.chaos_record_dropped();
"""
# Installed where `jobs_history` exists already (a run that starts at the head).
_ON_HISTORY = """
CREATE TRIGGER chaos_record_pruned AFTER DELETE ON jobqueue.jobs_history
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION public.chaos_record_pruned()
"""

# Every job row there is, in either table (once `jobs_history` exists, at 0014).
RETAINED = "(SELECT * FROM jobqueue.jobs UNION ALL SELECT * FROM jobqueue.jobs_history) AS jobs"

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
        if conn.execute("SELECT to_regclass('jobqueue.jobs_history')").fetchone() != (None,):
            conn.execute(_ON_HISTORY)
    finally:
        conn.execute("RESET search_path")


def jobs(query: Callable[..., list[tuple[Any, ...]]]) -> str:
    """What to read every job row from (`query` runs SQL): `RETAINED`, or `jobs` before
    0014."""
    ((history,),) = query("SELECT to_regclass('jobqueue.jobs_history') IS NOT NULL")
    return RETAINED if history else "jobqueue.jobs"


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
