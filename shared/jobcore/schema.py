"""The `jobs` table as SQLAlchemy Core metadata; Alembic migrations must match it."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from jobcore.states import Status

# Bump together with a new Alembic revision; services refuse to start on any other.
SCHEMA_REVISION = "0002"

metadata = sa.MetaData()

_STATUSES = ", ".join(f"'{s.value}'" for s in Status)

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
    sa.Column("type", sa.Text, nullable=False),
    sa.Column("payload", pg.JSONB(none_as_null=False), nullable=False),
    sa.Column("status", sa.Text, nullable=False, server_default=Status.PENDING.value),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    sa.Column("run_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("locked_until", sa.DateTime(timezone=True), nullable=True),
    sa.Column("lease_token", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("last_error", sa.Text, nullable=True),
    # The claim statement that last took the job (a random id per statement): lets a worker
    # hand back what a claim took when the claim's answer never reached it.
    sa.Column("claim_id", pg.UUID(as_uuid=True), nullable=True),
    sa.Column("idempotency_key", sa.Text, nullable=True),
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    sa.Column(
        "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    sa.CheckConstraint(f"status IN ({_STATUSES})", name="jobs_status_check"),
    sa.CheckConstraint("attempts >= 0", name="jobs_attempts_check"),
    sa.CheckConstraint("max_attempts BETWEEN 1 AND 100", name="jobs_max_attempts_check"),
    sa.CheckConstraint(
        "(status = 'processing') = (locked_until IS NOT NULL)", name="jobs_lease_check"
    ),
    # The claim query reads this index in order and stops after n rows.
    sa.Index(
        "jobs_claim_idx",
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
    sa.Index(
        "jobs_idempotency_key_idx",
        "idempotency_key",
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    ),
)
