"""Migrating a database to this version's schema: `jobqueue migrate`, and the same from
Python for applications that run their migrations from their own code.

    import jobcore.migrate

    done = jobcore.migrate.upgrade("postgresql://db/app")       # or DATABASE_URL
    if done.deferred:
        ...   # stopped after 0008 while the previous release runs: run it again later

The migrations ship inside the installed package (`jobqueue_migrations`, found with
importlib.resources; in a checkout, the `migrations/` folder beside the code that runs).
Everything lands in one PostgreSQL schema (`DATABASE_SCHEMA`, default `jobqueue`), which
the run creates; a database that an earlier release migrated, with its tables in `public`,
is adopted on the way (`adopt`). Synchronous: each call runs its own event loop, so call
it from synchronous code or a thread. Errors are `MigrationError` (under
`jobcore.JobqueueError`); an invalid URL or schema is `ConfigError`.

The deferral: revision 0009 drops the views through which the services of the release
before 0008 keep working during a rolling deploy. While sessions of that release are
connected (`PREVIOUS_RELEASE_SESSIONS`, by `application_name`), `upgrade` stops after 0008
and says so (`Upgraded.deferred`); once they are gone, the next run finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from jobcore import environ, naming
from jobcore.errors import ConfigError, JobqueueError
from jobcore.schema import SCHEMA_REVISION

DEFAULT_URL = "postgresql://localhost:5432/jobqueue"
# The revision that moved the tables into the schema and left the views for the previous
# release, and the one that drops them.
VIEWS_REVISION = "0008"
VIEWS_DROPPED_REVISION = "0009"
# The `application_name`s of the sessions of the release before 0008 (which named its
# sessions without a revision); this release's are `<name>/<revision>` (`db.session_name`).
PREVIOUS_RELEASE_SESSIONS = (
    "jobqueue",
    "jobqueue-api",
    "jobqueue-api-listen",
    "jobqueue-worker",
    "jobqueue-worker-listen",
    "jobqueue-worker-supervisor",
)


class MigrationError(JobqueueError):
    """A migration could not run, or the database's schema is in a state no revision of
    this version knows; the message says which and what to do."""


@dataclass(frozen=True)
class Upgraded:
    """What `upgrade` did: the revision found and the one reached (None: nothing there),
    and, when it stopped after 0008, how many sessions of the previous release it saw."""

    before: str | None
    after: str | None
    deferred: int = 0

    @property
    def at_head(self) -> bool:
        return self.after == SCHEMA_REVISION


@dataclass(frozen=True)
class State:
    """The database's revision (in the schema, else an earlier release's in `public`) and
    the head this version migrates to."""

    current: str | None
    head: str

    @property
    def at_head(self) -> bool:
        return self.current == self.head


# --- finding the migrations -----------------------------------------------------------


@contextlib.contextmanager
def _location() -> Iterator[Path]:
    """The folder holding env.py and versions/. In a checkout (jobcore imported from
    `shared/`) the checkout's own `migrations/`, so code and revisions always match; else the
    installed package's."""
    checkout = Path(__file__).resolve().parent.parent.parent / "migrations"
    if Path(__file__).resolve().parent.parent.name == "shared" and (checkout / "env.py").is_file():
        yield checkout
        return
    try:
        files = importlib.resources.files("jobqueue_migrations")
    except ModuleNotFoundError:
        raise MigrationError("the package jobqueue_migrations is not installed") from None
    with importlib.resources.as_file(files) as path:
        yield path


def config(database_url: str, schema: str, *, stdout: Any = None) -> Any:
    """An Alembic `Config` for `database_url` and `schema`, its location already set (use
    inside `_location()`)."""
    from alembic.config import Config

    cfg = Config(stdout=stdout) if stdout is not None else Config()
    cfg.attributes["database_url"] = database_url
    cfg.attributes["schema"] = schema
    cfg.attributes["skip_logging"] = True
    return cfg


def _settings(database_url: str | None, schema: str | None) -> tuple[str, str]:
    from jobcore.db import check_url

    url = database_url or environ.getenv("DATABASE_URL") or DEFAULT_URL
    try:
        check_url(url)
    except ValueError as exc:
        raise ConfigError(environ.variable("DATABASE_URL"), str(exc)) from None
    if schema is None:
        return url, naming.from_environment()
    try:
        return url, naming.check(schema)
    except ValueError as exc:
        raise ConfigError("DATABASE_SCHEMA", f"{exc} (got {schema!r})") from None


def _run_alembic(action: Any, database_url: str, schema: str, *args: Any, **kw: Any) -> str:
    """Run an Alembic command; what it printed (offline SQL). Alembic's own failures come
    back as MigrationError."""
    from alembic.util import CommandError

    out = io.StringIO()
    with _location() as location:
        cfg = config(database_url, schema, stdout=out)
        cfg.set_main_option("script_location", str(location))
        cfg.output_buffer = out
        try:
            action(cfg, *args, **kw)
        except CommandError as exc:
            raise MigrationError(str(exc)) from None
    return out.getvalue()


# --- reading the database --------------------------------------------------------------


@dataclass(frozen=True)
class _Found:
    revision: str | None
    in_public: bool  # recorded by an earlier release in public.alembic_version
    sessions: int  # of the previous release


def _read(database_url: str, schema: str) -> _Found:
    """The database's revision, where, and the previous release's sessions connected."""
    from jobcore.db import make_engine, session_name

    async def read() -> _Found:
        engine = make_engine(
            database_url,
            pool_size=1,
            application_name=session_name("jobqueue-migrate"),
            schema=naming.DEFAULT_SCHEMA,
        )
        try:
            async with engine.connect() as conn:
                return await conn.run_sync(
                    lambda sync: _Found(
                        revision(sync, schema),
                        not _has_version_table(sync, schema),
                        previous_release_sessions(sync),
                    )
                )
        finally:
            await engine.dispose()

    try:
        return asyncio.run(read())
    except JobqueueError:
        raise
    except Exception as exc:
        raise MigrationError(f"cannot read the database: {exc}") from exc


def _has_version_table(conn: Connection, schema: str) -> bool:
    found = conn.scalar(sa.text("SELECT to_regclass(:t)"), {"t": f"{schema}.alembic_version"})
    return found is not None


def revision(conn: Connection, schema: str) -> str | None:
    """The revision in `<schema>.alembic_version`, else an earlier release's row of ours in
    `public.alembic_version` (the one `adopt` carries over), else None."""
    if _has_version_table(conn, schema):
        found = conn.scalar(sa.text(f"SELECT version_num FROM {schema}.alembic_version"))
        return str(found) if found is not None else None
    return _public_revision(conn)


# The columns of jobqueue's jobs table since its first revision.
_FIRST_COLUMNS = (
    "id",
    "type",
    "payload",
    "status",
    "attempts",
    "max_attempts",
    "run_at",
    "locked_until",
    "lease_token",
)


def _public_revision(conn: Connection) -> str | None:
    """jobqueue's row in `public.alembic_version`, when jobqueue's tables are in `public`
    (the sign that a row there is ours and not an application's of the same name)."""
    if conn.scalar(sa.text("SELECT to_regclass('public.alembic_version')")) is None:
        return None
    if conn.scalar(sa.text("SELECT to_regclass('public.jobs')")) is None:
        return None
    # An application may have a `jobs` table and numbered revisions of its own: only a
    # table with jobqueue's columns (those of 0001) makes a row there ours.
    shaped = conn.scalar(
        sa.text(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = 'public.jobs'::regclass"
            " AND NOT attisdropped AND attname = ANY(:names)"
        ),
        {"names": list(_FIRST_COLUMNS)},
    )
    if shaped != len(_FIRST_COLUMNS):
        return None
    rows = [str(r) for r in conn.scalars(sa.text("SELECT version_num FROM public.alembic_version"))]
    ours = [r for r in rows if r.isdigit() and len(r) == 4 and r <= VIEWS_REVISION]
    if len(ours) > 1:
        raise MigrationError(f"public.alembic_version holds several revisions of ours: {ours}")
    return ours[0] if ours else None


def previous_release_sessions(conn: Connection) -> int:
    """Sessions of the release before 0008 connected to this database, this one aside."""
    found = conn.scalar(
        sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND application_name = ANY(:names)"
        ),
        {"names": list(PREVIOUS_RELEASE_SESSIONS)},
    )
    return int(found or 0)


# --- what env.py runs before the revisions ----------------------------------------------


def prepare(conn: Connection, schema: str, revisions: frozenset[str]) -> str:
    """Under the migration lock: create `schema`, adopt an earlier release's deployment
    (`adopt`), commit; returns the `search_path` the revisions run with (env.py)."""
    conn.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {schema}"))
    adopt(conn, schema, revisions)
    conn.commit()
    recorded = revision(conn, schema)
    in_public = conn.scalar(sa.text("SELECT to_regclass('public.jobs')")) is not None
    in_schema = conn.scalar(sa.text("SELECT to_regclass(:t)"), {"t": f"{schema}.jobs"})
    if recorded is not None and recorded < VIEWS_REVISION and in_public and not in_schema:
        # The revisions before 0008 go on where they always ran; 0008 moves the tables.
        return "public"
    return schema


def adopt(conn: Connection, schema: str, revisions: frozenset[str]) -> str | None:
    """A deployment of a release that kept everything in `public`: carry its revision from
    `public.alembic_version` into `<schema>.alembic_version`, delete that row from
    `public.alembic_version`, and drop that table only if the row was its only one (else it
    is an application's, which keeps it). Nothing when `<schema>.alembic_version` exists
    or `public` holds no revision of ours. Returns the revision carried over."""
    if conn.scalar(sa.text("SELECT to_regclass(:t)"), {"t": f"{schema}.alembic_version"}):
        return None
    found = _public_revision(conn)
    if found is None or found not in revisions:
        return None
    conn.execute(
        sa.text(
            f"CREATE TABLE {schema}.alembic_version (version_num varchar(32) NOT NULL,"
            " CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))"
        )
    )
    conn.execute(sa.text(f"INSERT INTO {schema}.alembic_version VALUES (:v)"), {"v": found})
    conn.execute(sa.text("DELETE FROM public.alembic_version WHERE version_num = :v"), {"v": found})
    if not conn.scalar(sa.text("SELECT EXISTS (SELECT 1 FROM public.alembic_version)")):
        conn.execute(sa.text("DROP TABLE public.alembic_version"))
    return found


# --- the calls --------------------------------------------------------------------------


def state(database_url: str | None = None, schema: str | None = None) -> State:
    """Where the database is (`--check`); nothing is written."""
    url, target = _settings(database_url, schema)
    return State(_read(url, target).revision, SCHEMA_REVISION)


def upgrade(
    database_url: str | None = None, schema: str | None = None, *, defer: bool = True
) -> Upgraded:
    """Upgrade the database at `database_url` (default DATABASE_URL) in `schema` (default
    DATABASE_SCHEMA, else `jobqueue`) to this version's head. With `defer` (the default),
    stop after 0008 while sessions of the previous release are connected: `deferred` then
    counts them, and a later call finishes. Safe to run concurrently and again."""
    from alembic import command

    url, target = _settings(database_url, schema)
    found = _read(url, target)
    before, sessions = found.revision, found.sessions
    wanted = "head"
    # Only while the views are still to be dropped: past that, the deferral has no reason.
    if defer and sessions and (before is None or before < VIEWS_DROPPED_REVISION):
        wanted = VIEWS_REVISION
    _run_alembic(command.upgrade, url, target, wanted)
    after = _read(url, target).revision
    return Upgraded(before, after, sessions if wanted == VIEWS_REVISION else 0)


def downgrade(revision: str, database_url: str | None = None, schema: str | None = None) -> None:
    """Downgrade to `revision` (an Alembic revision, `base` for none)."""
    from alembic import command

    url, target = _settings(database_url, schema)
    _run_alembic(command.downgrade, url, target, revision)


def sql(
    database_url: str | None = None, schema: str | None = None, *, start: str | None = None
) -> str:
    """The SQL that upgrades to the head from `start` (default: the revision the database
    records in the schema), printed instead of run. Offline SQL cannot adopt a deployment
    whose tables are still in `public`, nor write revision 0005 (its backfill reads the
    table): those need `upgrade`."""
    from alembic import command

    url, target = _settings(database_url, schema)
    if start is None:
        found = _read(url, target)
        if found.revision is not None and found.in_public:
            raise MigrationError(
                f"the database is at {found.revision}, kept in public by an earlier release: "
                "run `jobqueue migrate` (without --sql) to adopt it"
            )
        start = found.revision
    if start == SCHEMA_REVISION:
        return ""
    if start is None or start < "0005":
        raise MigrationError(
            f"the SQL from {start or 'an empty database'} cannot be written offline "
            "(revision 0005 reads the table): run `jobqueue migrate` instead"
        )
    return _run_alembic(command.upgrade, url, target, f"{start}:head", sql=True)
