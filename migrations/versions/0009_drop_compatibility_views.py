"""The contract step of 0008: the compatibility views in `public` go. Afterwards `public`
holds nothing of jobqueue's.

Run once no service of the release before 0008 runs: they read and write through the views.
`jobqueue migrate` stops after 0008 while sessions of that release are connected
(docs/upgrading.md). Only a view of jobqueue's is dropped: one in `public`, of a table's
name, reading that table in the schema; an application's own `public.jobs` stays.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("jobs", "job_rate_windows", "maintenance_leases", "job_types")


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:
        raise RuntimeError("0009 runs from jobqueue's env.py, which names the schema")
    return str(schema)


def _tables() -> str:
    return "ARRAY[" + ", ".join(f"'{t}'" for t in TABLES) + "]"


def upgrade() -> None:
    schema = _schema()
    # A DROP VIEW waits for the transactions using the view: give up rather than queue every
    # later query on it behind one of them (run it again then).
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        f"""
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY {_tables()} LOOP
        IF to_regclass('{schema}.' || quote_ident(t)) IS NOT NULL AND EXISTS (
            SELECT 1 FROM pg_class AS v
            JOIN pg_rewrite AS r ON r.ev_class = v.oid
            JOIN pg_depend AS d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
            WHERE v.oid = to_regclass('public.' || quote_ident(t)) AND v.relkind = 'v'
              AND d.refobjid = to_regclass('{schema}.' || quote_ident(t))
        ) THEN
            EXECUTE 'DROP VIEW public.' || quote_ident(t);
        END IF;
    END LOOP;
END $$"""
    )


def downgrade() -> None:
    schema = _schema()
    op.execute(
        f"""
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY {_tables()} LOOP
        IF to_regclass('{schema}.' || quote_ident(t)) IS NOT NULL
           AND to_regclass('public.' || quote_ident(t)) IS NULL THEN
            EXECUTE 'CREATE VIEW public.' || quote_ident(t)
                || ' AS SELECT *, xmax FROM {schema}.' || quote_ident(t);
        END IF;
    END LOOP;
END $$"""
    )
