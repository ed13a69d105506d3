"""jobqueue's tables as SQLAlchemy Core metadata, in schema `DEFAULT_SCHEMA`; Alembic
migrations must match it.

Every construct renders its tables schema-qualified (`jobqueue.jobs`); a process configured
with another `DATABASE_SCHEMA` rewrites that qualifier where SQL is sent (`jobcore.naming`).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from jobcore.naming import DEFAULT_SCHEMA
from jobcore.states import Status

# Bump together with a new Alembic revision: the head this code migrates to.
SCHEMA_REVISION = "0016"
# The revisions this code works on; services refuse to start on any other. 0016 adds the
# index and the function KEY_CONCURRENCY's count from a lease floor reads (docs/upgrading.md).
ACCEPTED_REVISIONS = frozenset({SCHEMA_REVISION})

# What a job's routing fields may hold; the API and the table check the same rules.
QUEUE_PATTERN = "^[a-z0-9][a-z0-9_.-]{0,62}$"
MIN_PRIORITY, MAX_PRIORITY = -100, 100
MIN_TIMEOUT, MAX_TIMEOUT = 1.0, 86400.0
MAX_KEY_LENGTH = 255
# `errors` keeps the last ERRORS_KEPT failed attempts, each traceback cut to its last
# TRACEBACK_LIMIT bytes (its end says where it failed).
ERRORS_KEPT = 20
TRACEBACK_LIMIT = 8192

# The list indexes: name -> the columns before `id`.
LIST_INDEXES = {"status": ("status",), "type": ("type", "status"), "queue": ("queue", "status")}

metadata = sa.MetaData(schema=DEFAULT_SCHEMA)

_STATUSES = ", ".join(f"'{s.value}'" for s in Status)


def _job_columns(*, keyed: bool) -> list[sa.Column[Any]]:
    """A job's columns, as `jobs` and `jobs_history` both hold them; `keyed`: `id` is the
    primary key (a partitioned table's key would have to hold its partition key)."""
    return [
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=keyed, nullable=False),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("payload", pg.JSONB(none_as_null=False), nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default=Status.PENDING.value),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column(
            "run_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("locked_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_token", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text, nullable=True),
        # The claim statement that last took the job (a random id per statement): lets a worker
        # hand back what a claim took when the claim's answer never reached it.
        sa.Column("claim_id", pg.UUID(as_uuid=True), nullable=True),
        sa.Column("queue", sa.Text, nullable=False, server_default="default"),
        # Higher runs first.
        sa.Column("priority", sa.SmallInteger, nullable=False, server_default="0"),
        # This job's per-attempt limit in seconds; NULL: the worker's JOB_TIMEOUT.
        sa.Column("timeout", sa.Float, nullable=True),
        sa.Column("idempotency_key", sa.Text, nullable=True),
        # Jobs of one key share its KEY_CONCURRENCY and take turns with other keys' jobs (fair
        # dispatch); NULL: no key (the key-less jobs take their turn as one more key, '').
        # Compared in byte order ("C"), as the worker compares them (`jobcore.turns`).
        sa.Column("concurrency_key", sa.Text(collation="C"), nullable=True),
        # The worker process that holds the current lease (`<host>:<pid>`), written by every
        # claim and kept once the attempt ends (who ran it last); NULL until the first claim.
        sa.Column("leased_by", sa.Text, nullable=True),
        # What the handler returned (JSON; NULL for None), set by `complete`.
        sa.Column("result", pg.JSONB(none_as_null=True), nullable=True),
        # When an operator asked to stop the running attempt; the holder ends it `cancelled`.
        sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True),
        # When the job reached a finished status (completed, failed, dead_letter, cancelled);
        # retention counts age from it.
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        # Someone waits for the job to finish (`GET /jobs/{id}?wait=`): the write that finishes
        # it notifies. False for almost every job, so finishing costs no notification.
        sa.Column("awaited", sa.Boolean, nullable=False, server_default=sa.false()),
        # The submitting request's W3C trace context (`traceparent`), for the attempt's span to
        # link to; NULL when tracing is off.
        sa.Column("traceparent", sa.Text, nullable=True),
        # The failed attempts, oldest first, the last ERRORS_KEPT: [{"attempt", "at", "error",
        # "traceback"}]; NULL until one fails.
        sa.Column("errors", pg.JSONB(none_as_null=True), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    ]


jobs = sa.Table(
    "jobs",
    metadata,
    *_job_columns(keyed=True),
    sa.CheckConstraint(f"status IN ({_STATUSES})", name="jobs_status_check"),
    sa.CheckConstraint("attempts >= 0", name="jobs_attempts_check"),
    sa.CheckConstraint("max_attempts BETWEEN 1 AND 100", name="jobs_max_attempts_check"),
    sa.CheckConstraint(
        "(status = 'processing') = (locked_until IS NOT NULL)", name="jobs_lease_check"
    ),
    sa.CheckConstraint(f"queue ~ '{QUEUE_PATTERN}'", name="jobs_queue_check"),
    sa.CheckConstraint(
        f"priority BETWEEN {MIN_PRIORITY} AND {MAX_PRIORITY}", name="jobs_priority_check"
    ),
    sa.CheckConstraint(
        f"timeout IS NULL OR timeout BETWEEN {MIN_TIMEOUT:g} AND {MAX_TIMEOUT:g}",
        name="jobs_timeout_check",
    ),
    sa.CheckConstraint(
        f"concurrency_key IS NULL OR (char_length(concurrency_key) BETWEEN 1 AND {MAX_KEY_LENGTH}"
        " AND concurrency_key !~ '[[:cntrl:]]')",
        name="jobs_concurrency_key_check",
    ),
    # The claim reads this index in claim order: per queue, per priority (highest first),
    # per concurrency key in turn (the key-less jobs under ''), the due jobs by run_at,
    # stopping after n rows or at the first job not yet due.
    sa.Index(
        "jobs_claim_key_idx",
        "queue",
        sa.text("priority DESC"),
        sa.text("(coalesce(concurrency_key, ''))"),
        "run_at",
        "id",
        postgresql_where=sa.text("status = 'pending'"),
    ),
    # The claim order without keys: the plain claim (`JOB_CLAIM_PLAIN`, where no key has
    # jobs) reads it, as the release before 0011 claims through it.
    sa.Index(
        "jobs_claim_queue_idx",
        "queue",
        sa.text("priority DESC"),
        "run_at",
        "id",
        postgresql_where=sa.text("status = 'pending'"),
    ),
    # KEY_CONCURRENCY counts a key's running jobs here, not among every running job, from
    # a lease floor (`jobcore.floors`): under a held horizon the attempts that ended since
    # the pin stay in the index as dead entries, most of them below the floor.
    sa.Index(
        "jobs_key_lease_idx",
        "queue",
        "concurrency_key",
        "locked_until",
        postgresql_where=sa.text("status = 'processing' AND concurrency_key IS NOT NULL"),
    ),
    # A type held by TYPE_CONCURRENCY or TYPE_RATE is claimed by type: per type and queue,
    # in claim order, without reading other types' pending jobs.
    sa.Index(
        "jobs_claim_type_idx",
        "type",
        "queue",
        sa.text("priority DESC"),
        "run_at",
        "id",
        postgresql_where=sa.text("status = 'pending'"),
    ),
    # recover_expired scans only leased rows.
    sa.Index(
        "jobs_lease_idx",
        "locked_until",
        postgresql_where=sa.text("status = 'processing'"),
    ),
    # Listing and searching (`GET /jobs`, newest first): per status, per type and status, per
    # queue and status, in id order. Running jobs are left out (they are few, and the lease
    # index holds them): a claim then writes no entry in these.
    *(
        sa.Index(
            f"jobs_{name}_idx",
            *columns,
            "id",
            postgresql_where=sa.text("status <> 'processing'"),
        )
        for name, columns in LIST_INDEXES.items()
    ),
    # Jobs by when they finished: the jobs finished per minute over the last hour are a
    # range read of that hour.
    sa.Index(
        "jobs_finished_idx",
        "finished_at",
        postgresql_where=sa.text("finished_at IS NOT NULL"),
    ),
    # The completed jobs that move to `jobs_history` (`jobcore.history`), oldest first: the
    # move reads exactly those, however many keyed or failed jobs `jobs` keeps.
    sa.Index(
        "jobs_movable_idx",
        "finished_at",
        postgresql_where=sa.text(
            f"status = '{Status.COMPLETED.value}' AND idempotency_key IS NULL"
        ),
    ),
    sa.Index(
        "jobs_idempotency_key_idx",
        "idempotency_key",
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    ),
)

# Completed jobs moved out of `jobs` after they finished (`jobcore.history`), partitioned by
# when they finished, one leaf per hour or day: retention drops a leaf whole once its end
# is older than RETENTION_COMPLETED, and deletes row by row only in the leaf it ends in.
# `jobs` keeps the live jobs and the rest (failed, cancelled and dead letters, which an
# operator may retry or cancel, and keyed jobs, whose idempotency key its unique index
# keeps unique), and stays small however many jobs have run. No primary key: a
# partitioned table's would have to hold `finished_at`; a job is in one table or the other
# (the move deletes what it inserts, in one statement).
jobs_history = sa.Table(
    "jobs_history",
    metadata,
    *_job_columns(keyed=False),
    sa.CheckConstraint(
        f"status = '{Status.COMPLETED.value}' AND finished_at IS NOT NULL"
        " AND idempotency_key IS NULL",
        name="jobs_history_moved_check",
    ),
    sa.Index("jobs_history_id_idx", "id"),
    # Listing, newest first: every job here has the status completed.
    sa.Index("jobs_history_type_idx", "type", "id"),
    sa.Index("jobs_history_queue_idx", "queue", "id"),
    sa.Index("jobs_history_finished_idx", "finished_at"),
    postgresql_partition_by="RANGE (finished_at)",
)

# TYPE_RATE: attempts of a type started in its current fixed window (aligned on the database
# clock), one row per rate-limited type, written only under that type's claim lock.
job_rate_windows = sa.Table(
    "job_rate_windows",
    metadata,
    sa.Column("type", sa.Text, primary_key=True),
    sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
    sa.Column("used", sa.Integer, nullable=False),
)

# Maintenance that one worker at a time does (queue gauges, retention): who leads each task,
# until when. A worker takes the lead when it is free or expired, and keeps it by renewing.
maintenance_leases = sa.Table(
    "maintenance_leases",
    metadata,
    sa.Column("task", sa.Text, primary_key=True),
    sa.Column("holder", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
)

# What the workers serve: per type some worker has a handler for, that handler's options
# (defaults for a create request that omits them: queue, priority, max_attempts, timeout) and
# the type's periodic schedules; written by each worker process at start and refreshed while
# it serves the type, so the API accepts the type without importing handler code.
job_types = sa.Table(
    "job_types",
    metadata,
    sa.Column("type", sa.Text, primary_key=True),
    sa.Column("options", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("schedules", pg.JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
    sa.Column("recorded_by", sa.Text, nullable=False),
    sa.Column(
        "recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
)

# The queues an operator paused (`jobcore.pauses`): one row per paused queue, deleted when it
# is resumed. Workers claim nothing from a queue listed here.
queue_pauses = sa.Table(
    "queue_pauses",
    metadata,
    sa.Column("queue", sa.Text, primary_key=True),
    sa.Column(
        "paused_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    sa.CheckConstraint(f"queue ~ '{QUEUE_PATTERN}'", name="queue_pauses_queue_check"),
)
