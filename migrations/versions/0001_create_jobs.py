"""Create the jobs table and the indexes the claim, recovery and idempotency queries use.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("payload", pg.JSONB, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="pending"),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column(
            "run_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("locked_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_token", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("idempotency_key", sa.Text, nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint(
            "status IN ('pending', 'processing', 'completed', 'failed', 'dead_letter')",
            name="jobs_status_check",
        ),
        sa.CheckConstraint("attempts >= 0", name="jobs_attempts_check"),
        sa.CheckConstraint("max_attempts BETWEEN 1 AND 100", name="jobs_max_attempts_check"),
        sa.CheckConstraint(
            "(status = 'processing') = (locked_until IS NOT NULL)", name="jobs_lease_check"
        ),
    )
    op.create_index(
        "jobs_claim_idx", "jobs", ["run_at", "id"], postgresql_where=sa.text("status = 'pending'")
    )
    op.create_index(
        "jobs_lease_idx",
        "jobs",
        ["locked_until"],
        postgresql_where=sa.text("status = 'processing'"),
    )
    op.create_index(
        "jobs_idempotency_key_idx",
        "jobs",
        ["idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    # Every job row is updated several times: leave room on each page for
    # heap-only-tuple updates, and vacuum this hot table far more eagerly than
    # the default 20% dead rows.
    op.execute(
        "ALTER TABLE jobs SET (fillfactor = 70,"
        " autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,"
        " autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 1)"
    )


def downgrade() -> None:
    op.drop_table("jobs")
