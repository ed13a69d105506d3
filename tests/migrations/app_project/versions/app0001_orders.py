"""The application's tables: orders, and a `jobs` of its own.

Revision ID: app0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "app0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("orders", sa.Column("id", sa.Integer, primary_key=True))
    op.create_table(
        "jobs", sa.Column("id", sa.Integer, primary_key=True), sa.Column("name", sa.Text)
    )


def downgrade() -> None:
    op.drop_table("jobs")
    op.drop_table("orders")
