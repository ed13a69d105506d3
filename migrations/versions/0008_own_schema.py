"""jobqueue's own schema: the tables of a deployment that kept them in `public` move into
`DATABASE_SCHEMA` (default `jobqueue`), and `public` keeps, for one release, a view of the
same name over each moved table, through which the previous release's services (which name
the tables unqualified, with `search_path` at `public`) go on reading and writing.

`ALTER TABLE ... SET SCHEMA` moves a table with its indexes, constraints and owned sequences
(jobqueue has no sequence, type or function of its own), rewriting nothing: a catalogue
change under a brief ACCESS EXCLUSIVE lock, given up after 5 s rather than queued behind a
long transaction (every query on the table would queue behind it); run it again then. The
views are simple (one table, every column), so PostgreSQL updates through them itself:
INSERT ... ON CONFLICT on the table's unique indexes, UPDATE ... RETURNING, SELECT ... FOR
UPDATE SKIP LOCKED. A view has the table's column defaults. Each view also shows the
table's system column `xmax`: the previous release's submit tells a created job from a
replay by `RETURNING (xmax = 0)`, and a view has no system columns of its own (a column
PostgreSQL cannot update through, which no statement writes).

A table is moved only if it is in `public` and not in the schema: on a new database,
0001-0007 created everything in the schema already (an application's own `public.jobs` is
never touched). The move, the views and the removal of jobqueue's row from
`public.alembic_version` (which an adopted deployment's downgrade put back) are one
transaction: the revision applies whole or not at all. 0009 drops the views.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("jobs", "job_rate_windows", "maintenance_leases", "job_types")
PREVIOUS = "0007"  # the revision the previous release's services check for
# The schema's comment once 0008 moved a deployment's tables out of public.
ADOPTED = "jobqueue: moved from public by 0008"


def _schema() -> str:
    schema = op.get_context().version_table_schema
    if not schema:
        raise RuntimeError("0008 runs from jobqueue's env.py, which names the schema")
    return str(schema)


def _tables() -> str:
    return "ARRAY[" + ", ".join(f"'{t}'" for t in TABLES) + "]"


def upgrade() -> None:
    schema = _schema()
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        f"""
DO $$
DECLARE
    t text;
    moved boolean := false;
BEGIN
    FOREACH t IN ARRAY {_tables()} LOOP
        IF to_regclass('public.' || quote_ident(t)) IS NOT NULL
           AND (SELECT relkind FROM pg_class
                WHERE oid = to_regclass('public.' || quote_ident(t))) = 'r'
           AND to_regclass('{schema}.' || quote_ident(t)) IS NULL THEN
            EXECUTE 'ALTER TABLE public.' || quote_ident(t) || ' SET SCHEMA {schema}';
            EXECUTE 'CREATE VIEW public.' || quote_ident(t)
                || ' AS SELECT *, xmax FROM {schema}.' || quote_ident(t);
            moved := true;
        END IF;
    END LOOP;
    -- The tables were in public: a version row of jobqueue's left there is ours, and a
    -- downgrade puts them back there (and only then).
    IF moved THEN
        EXECUTE 'COMMENT ON SCHEMA {schema} IS ' || quote_literal('{ADOPTED}');
    END IF;
    IF moved AND to_regclass('public.alembic_version') IS NOT NULL THEN
        DELETE FROM public.alembic_version WHERE version_num = '{PREVIOUS}';
        IF NOT EXISTS (SELECT 1 FROM public.alembic_version) THEN
            DROP TABLE public.alembic_version;
        END IF;
    END IF;
END $$"""
    )
    # Whatever ran before in public (an adopted deployment's revisions) ends here.
    op.execute(f"SET search_path TO {schema}")


def downgrade() -> None:
    """Back to the layout before: a deployment 0008 moved out of `public` (the schema's
    comment says so) gets its tables back there, and its revision in
    `public.alembic_version` (where the previous release's services read it); a database
    that was created in the schema keeps its tables there and leaves `public` alone."""
    schema = _schema()
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        f"""
DO $$
DECLARE
    t text;
    adopted boolean := coalesce(
        obj_description(to_regnamespace('{schema}'), 'pg_namespace') = '{ADOPTED}', false);
BEGIN
    FOREACH t IN ARRAY {_tables()} LOOP
        IF (SELECT relkind FROM pg_class
            WHERE oid = to_regclass('public.' || quote_ident(t))) = 'v' THEN
            EXECUTE 'DROP VIEW public.' || quote_ident(t);
        END IF;
        IF adopted AND to_regclass('{schema}.' || quote_ident(t)) IS NOT NULL THEN
            IF to_regclass('public.' || quote_ident(t)) IS NOT NULL THEN
                RAISE EXCEPTION USING MESSAGE =
                    'cannot move {schema}.' || t || ' back: public.' || t || ' exists';
            END IF;
            EXECUTE 'ALTER TABLE {schema}.' || quote_ident(t) || ' SET SCHEMA public';
        END IF;
    END LOOP;
    IF adopted THEN
        CREATE TABLE IF NOT EXISTS public.alembic_version (
            version_num varchar(32) NOT NULL,
            CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)
        );
        INSERT INTO public.alembic_version VALUES ('{PREVIOUS}') ON CONFLICT DO NOTHING;
        EXECUTE 'COMMENT ON SCHEMA {schema} IS NULL';
        -- The revisions below this one name their tables unqualified: they find them in
        -- public now (the session's setting, not the transaction's: a revision may go on
        -- in autocommit).
        PERFORM set_config('search_path', 'public', false);
    END IF;
END $$"""
    )
