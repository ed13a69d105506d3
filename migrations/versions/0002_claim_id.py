"""Add jobs.claim_id: which claim statement took a job, so a claim whose answer never
reached its worker can be handed back without spending the attempt.

A nullable column without a default: no table rewrite, a brief lock only.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("claim_id", pg.UUID(as_uuid=True), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "claim_id")
