"""The application's Alembic environment, as `alembic init` writes one: the default version
table (`public.alembic_version`), its own metadata, default autogenerate settings."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

metadata = sa.MetaData()
sa.Table("orders", metadata, sa.Column("id", sa.Integer, primary_key=True))
# A table of the application's own that has one of jobqueue's names.
sa.Table(
    "jobs", metadata, sa.Column("id", sa.Integer, primary_key=True), sa.Column("name", sa.Text)
)

config = context.config
engine = sa.create_engine(config.attributes["url"])
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
