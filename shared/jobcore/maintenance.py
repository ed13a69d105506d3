"""What one worker at a time does for the whole database: who leads a maintenance task
(`take_lead`), and retention (`prune`). Constructs only; the worker runs them through
`jobcore.compiled` (docs/worker.md, "Maintenance").

Leadership is a row per task in `maintenance_leases`: a worker takes it when it is free
or its lease has run out, and keeps it by renewing before then. No coordinator, no
session that must stay open: a leader that dies is replaced once its lease runs out.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from jobcore import naming
from jobcore.schema import maintenance_leases, metadata
from jobcore.states import FINISHED, Status

# The tasks that have a leader.
GAUGES = "queue_gauges"
HISTORY = "history"
RETENTION = "retention"
VACUUM = "vacuum"

_m = maintenance_leases.c
_take = pg.insert(maintenance_leases).values(
    task=sa.bindparam("task", type_=sa.Text),
    holder=sa.bindparam("holder", type_=pg.UUID(as_uuid=True)),
    expires_at=sa.func.now()
    + sa.bindparam("lease_seconds", type_=sa.Float) * sa.literal_column("interval '1 second'"),
)
# A row back: the caller leads `task` until the lease it asked for runs out.
LEAD_TAKE = _take.on_conflict_do_update(
    index_elements=[_m.task],
    set_={"holder": _take.excluded.holder, "expires_at": _take.excluded.expires_at},
    where=sa.or_(_m.holder == _take.excluded.holder, _m.expires_at < sa.func.now()),
).returning(_m.holder)

# Let another worker lead at once (at shutdown).
LEAD_RESIGN = sa.delete(maintenance_leases).where(
    _m.task == sa.bindparam("task", type_=sa.Text),
    _m.holder == sa.bindparam("holder", type_=pg.UUID(as_uuid=True)),
)

# Rows a prune deletes at most: each delete is short, and holds few locks.
PRUNE_BATCH = 5000

# The smallest time-ordered id (UUID version 7, `jobcore.ids`) of the millisecond `now() -
# age`: every job created before then has a lower id. Bounding the read by it keeps a prune
# from reading the young finished jobs (most of them, with retention on) again every time.
_CREATED_BEFORE = """CAST(regexp_replace(
    lpad(to_hex(floor(extract(epoch FROM now() - CAST(:age AS float8) * interval '1 second')
                      * 1000)::bigint), 12, '0') || '00000000000000000000',
    '^(.{8})(.{4})(.{4})(.{4})(.{12})$', '\\1-\\2-\\3-\\4-\\5') AS uuid)"""


def _prune(status: Status) -> sa.TextualSelect:
    # A job finishes after it is created: one that finished `age` ago was created before,
    # so the id bound keeps every job old enough (and, rarely, reads one created long
    # before it finished). The status as a range, in the sort, and the id bound as a row
    # with the status: only `jobs_status_idx` can take that bound as an index condition.
    # With `=`, or with the bound on `id` alone, the planner may take the primary key for a
    # common status (a generic plan guesses a third of the table below the bound) and
    # filter its way through every older job of the statuses kept longer.
    #
    # A job finished by a release before 0005 (still running during the rollout to it) has
    # no `finished_at`: its `updated_at` is when it finished (the time of its last
    # transition, as 0005's backfill took it), so it ages from there. A condition on the
    # rows the index range reads, so it costs the prune nothing and the hot path nothing
    # (docs/upgrading.md).
    value = status.value
    return sa.text(
        f"""
WITH gone AS (
    DELETE FROM jobqueue.jobs WHERE id = ANY(ARRAY(
        SELECT id FROM jobqueue.jobs
        WHERE status BETWEEN '{value}' AND '{value}'
          AND (status, id) < ('{value}', {_CREATED_BEFORE})
          AND coalesce(finished_at, updated_at)
              < now() - CAST(:age AS float8) * interval '1 second'
        ORDER BY status, id LIMIT {PRUNE_BATCH}
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING 1
)
SELECT count(*) AS pruned FROM gone"""
    ).columns(sa.column("pruned", sa.BigInteger))


# Per finished status: delete at most PRUNE_BATCH of its jobs that finished more than `age`
# seconds ago; returns how many.
JOB_PRUNE: dict[Status, sa.TextualSelect] = {status: _prune(status) for status in sorted(FINISHED)}


# --- vacuum, where autovacuum does not (jobqueue_worker.vacuum) ----------------------------

# jobqueue's tables, as SQL names, schema-qualified (in the default schema, as every
# statement is written: `tables()` names them in the process's schema).
TABLES = [table.fullname for table in metadata.sorted_tables]


def tables() -> list[str]:
    """`TABLES` in this process's schema (`jobcore.naming`)."""
    return [naming.translate(table) for table in TABLES]


# Per table of jobqueue's: its dead tuples as the statistics count them, and whether
# autovacuum will ever vacuum it (on for the server, not turned off for the table).
TABLE_GET_STATS = sa.text(
    """
SELECT t.name, coalesce(s.n_dead_tup, 0) AS dead,
       current_setting('autovacuum') = 'on'
       AND NOT coalesce('autovacuum_enabled=false' = ANY(c.reloptions), false) AS autovacuum
FROM unnest(CAST(:tables AS text[])) AS t(name)
JOIN pg_class AS c ON c.oid = CAST(t.name AS regclass)
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
ORDER BY 1"""
).columns(
    sa.column("name", sa.Text),
    sa.column("dead", sa.BigInteger),
    sa.column("autovacuum", sa.Boolean),
)


def vacuum_sql(table: str) -> str:
    """`VACUUM` of one of `TABLES`, skipping it if another vacuum (or DDL) holds it. Not a
    construct: VACUUM runs outside any transaction and takes no parameters."""
    if table not in tables():
        raise ValueError(f"not one of jobqueue's tables: {table!r}")
    return f"VACUUM (SKIP_LOCKED) {table}"


# By their SQL name, for `jobcore.queries.named()`.
NAMED = {
    "lead_take": LEAD_TAKE,
    "lead_resign": LEAD_RESIGN,
    **{f"job_prune_{status}": statement for status, statement in JOB_PRUNE.items()},
    "table_get_stats": TABLE_GET_STATS,
}
