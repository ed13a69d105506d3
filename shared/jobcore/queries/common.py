"""What every statement of the jobs table shares: its channels, status literals and guards,
the batch parameters (`unnest`), and the expressions the writes that end an attempt
share (`finish_time`, `unless_cancelled`, `WOKE`)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from jobcore.rows import JOB_FIELDS
from jobcore.schema import ERRORS_KEPT, jobs, jobs_history
from jobcore.states import FINISHED, Operation, Status

c = jobs.c

# Workers LISTEN on this channel; a notification is only a hint that jobs are
# due, so polling stays correct when one is lost.
NOTIFY_CHANNEL = "jobqueue_jobs"
# The API's waiters LISTEN on this one: a write that finishes a job someone waits for
# (`awaited`) sends its id.
FINISHED_CHANNEL = "jobqueue_finished"
ONE_SECOND: Any = sa.literal_column("interval '1 second'")


def status_literal(status: Status) -> Any:
    """A status as an SQL literal, never a parameter: the planner must see
    `status = 'pending'` to use the partial indexes, also in generic plans."""
    return sa.literal_column(f"'{status.value}'", sa.Text)


def status_in(statuses: Any) -> Any:
    """`status IN (...)` with literals, in a stable order."""
    return c.status.in_([status_literal(status) for status in sorted(statuses)])


def guard(operation: Operation) -> Any:
    """`status = '<from>'` (or `IN (...)`) for the statuses `operation` may start from."""
    sources = sorted(operation.sources)
    if len(sources) == 1:
        return c.status == status_literal(sources[0])
    return c.status.in_([status_literal(status) for status in sources])


JOB_COLUMNS = [jobs.c[name] for name in JOB_FIELDS]
# The same columns of `jobs_history`, where completed jobs move (`jobcore.history`): a read
# of finished jobs reads both tables.
HISTORY_COLUMNS = [jobs_history.c[name] for name in JOB_FIELDS]


def unnest(**arrays: tuple[str, Any]) -> Any:
    """`unnest(:ids, :tokens, ...) AS o(id, token, ...)`: one row per job in the batch."""
    params = [sa.bindparam(param, type_=pg.ARRAY(type_)) for param, type_ in arrays.values()]
    columns = [sa.column(name, type_) for name, (_, type_) in arrays.items()]
    return sa.func.unnest(*params).table_valued(*columns).render_derived(name="o")


LEASES = {"id": ("ids", pg.UUID(as_uuid=True)), "token": ("tokens", sa.BigInteger)}
# A failed attempt's error (`last_error`) and its formatted traceback (NULL: none).
ERRORS = {"error": ("errors", sa.Text), "traceback": ("tracebacks", sa.Text)}
DELAYS = {"delay": ("delays", sa.Float)}
RESULTS = {"result": ("results", sa.Text)}


def finish_time(status: Any) -> Any:
    """finished_at for a row whose new status is `status` (a column or an expression)."""
    return sa.case((status.in_([status_literal(s) for s in sorted(FINISHED)]), sa.func.now()))


# Evaluated per row a write returns, with the row's new values: the id of a job that just
# finished, for the API's waiters, only when someone waits for it (`awaited`); no
# notification otherwise, so finishing costs nothing when nobody waits.
WOKE: Any = sa.case(
    (
        sa.and_(c.awaited, status_in(FINISHED)),
        sa.func.pg_notify(sa.literal_column(f"'{FINISHED_CHANNEL}'"), sa.cast(c.id, sa.Text)),
    )
).label("woke")


def unless_cancelled(target: Status) -> Any:
    """`target`, or `cancelled` when a cancel was requested: a job whose holder lets it go
    (to run again later) must not run again after an operator cancelled it."""
    return sa.case(
        (c.cancel_requested_at.is_not(None), status_literal(Status.CANCELLED)),
        else_=status_literal(target),
    )


def errors_appended(attempt: Any, error: Any, traceback: Any) -> Any:
    """`errors` with one more entry (`attempt`, `at` now, `error`, `traceback`, which may be
    NULL), the last ERRORS_KEPT kept: every write that records a failed attempt sets
    `errors` to this."""
    entry = sa.func.jsonb_build_array(
        sa.func.jsonb_build_object(
            sa.literal_column("'attempt'"),
            attempt,
            sa.literal_column("'at'"),
            sa.func.now(),
            sa.literal_column("'error'"),
            error,
            sa.literal_column("'traceback'"),
            traceback,
        )
    )
    appended = sa.func.coalesce(c.errors, sa.literal_column("'[]'::jsonb")).op("||")(entry)
    last: Any = sa.literal_column(f"'$[last - {ERRORS_KEPT - 1} to last]'::jsonpath")
    return sa.func.jsonb_path_query_array(appended, last)
