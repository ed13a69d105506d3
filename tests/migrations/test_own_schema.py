"""Living in the application's database (docs/operations.md#migrations,
docs/upgrading.md): every object of jobqueue's in its own schema, an application's Alembic
project beside it in either order, a deployment of the previous release (everything in
`public`) adopted by one command while that release keeps running through 0008's views,
the deferral of 0009 while it runs, and 0009 and 0008 undone back to the previous
release's layout."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy.engine import make_url

from jobcore import migrate
from jobcore.schema import SCHEMA_REVISION
from tests import pg
from tests.migrations import releases, rollout
from tests.procs import BIN

APP = Path(__file__).resolve().parent / "app_project"
OURS = ("jobs", "job_rate_windows", "maintenance_leases", "job_types")
# The last release that kept its tables in `public`: the deployment 0008 adopts.
PREVIOUS = "0007"
assert PREVIOUS in releases.released_before_head()


def _sql(url: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(query, args or None)
        return list(cursor.fetchall()) if cursor.description is not None else []


def _relations(url: str, schema: str) -> set[str]:
    rows = _sql(
        url,
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relkind IN ('r', 'v', 'i', 'S', 'p')",
        schema,
    )
    return {r[0] for r in rows}


def _app_config(url: str) -> Config:
    config = Config(str(APP / "alembic.ini"))
    config.attributes["url"] = (
        make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    )
    return config


def _app_proposes(url: str) -> list[Any]:
    """What the application's autogenerate, with its default settings, would change."""
    env: dict[str, Any] = {}
    exec((APP / "env.py").read_text().split("config = context.config")[0], env)
    engine = sa.create_engine(_app_config(url).attributes["url"])
    try:
        with engine.connect() as conn:
            return list(compare_metadata(MigrationContext.configure(conn), env["metadata"]))
    finally:
        engine.dispose()


def _cli(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "jobqueue"), "migrate", *args],
        env={**os.environ, "DATABASE_URL": url, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _in_public_of_ours(url: str) -> set[str]:
    """Relations in `public` that are jobqueue's (its tables' names, their indexes, the
    version table holding a row of ours)."""
    found = {r for r in _relations(url, "public") if r in OURS or r.startswith("jobs_")}
    if "alembic_version" in _relations(url, "public"):
        rows = {r[0] for r in _sql(url, "SELECT version_num FROM public.alembic_version")}
        if rows & set(releases.revisions()):
            found.add("alembic_version")
    return found


# --- a new database -----------------------------------------------------------------------


@pytest.mark.parametrize("first", ["application", "jobqueue"])
def test_an_application_and_jobqueue_share_a_database_in_either_order(empty_database_url, first):
    url = empty_database_url
    steps = [
        lambda: command.upgrade(_app_config(url), "head"),
        lambda: migrate.upgrade(url),
    ]
    for step in steps if first == "application" else reversed(steps):
        step()
    # Both at head, each in its own version table; the application's `jobs` is its own.
    assert _sql(url, "SELECT version_num FROM public.alembic_version") == [("app0001",)]
    assert migrate.state(url).at_head
    assert {"orders", "jobs", "alembic_version"} <= _relations(url, "public")
    assert _sql(
        url,
        "SELECT count(*) FROM information_schema.columns WHERE table_schema ="
        " 'public' AND table_name = 'jobs'",
    ) == [(2,)]
    assert set(OURS) | {"alembic_version"} <= _relations(url, "jobqueue")
    # Running either again changes nothing, and the application's autogenerate proposes
    # nothing about jobqueue's objects (nor anything else).
    command.upgrade(_app_config(url), "head")
    assert migrate.upgrade(url).before == SCHEMA_REVISION
    assert _app_proposes(url) == []


def test_a_new_database_has_nothing_of_jobqueues_in_public(empty_database_url):
    migrate.upgrade(empty_database_url)
    assert _relations(empty_database_url, "public") == set()
    assert "jobs_claim_queue_idx" in _relations(empty_database_url, "jobqueue")


def test_another_schema_by_database_schema(empty_database_url):
    done = _cli(empty_database_url, DATABASE_SCHEMA="queueing")
    assert done.returncode == 0, done.stderr
    assert set(OURS) <= _relations(empty_database_url, "queueing")
    assert "jobqueue" not in {
        r[0] for r in _sql(empty_database_url, "SELECT nspname FROM pg_namespace")
    }
    assert _cli(empty_database_url, "--check", DATABASE_SCHEMA="queueing").returncode == 0
    assert _cli(empty_database_url, "--check").returncode == 1  # jobqueue's is empty


def test_migrate_check_and_sql(empty_database_url):
    url = empty_database_url
    behind = _cli(url, "--check")
    assert (behind.returncode, behind.stdout) == (
        1,
        f"behind: current none, wanted {SCHEMA_REVISION}\n",
    )
    command.upgrade(pg.alembic_config(url), "0007")
    printed = _cli(url, "--sql")
    assert printed.returncode == 0, printed.stderr
    assert "SET search_path TO jobqueue;" in printed.stdout
    assert "-- Running upgrade 0007 -> 0008" in printed.stdout and "SET SCHEMA" in printed.stdout
    assert "UPDATE jobqueue.alembic_version SET version_num='0009'" in printed.stdout
    assert _sql(url, "SELECT version_num FROM jobqueue.alembic_version") == [("0007",)]  # not run
    done = _cli(url)
    assert (done.returncode, done.stdout) == (0, f"upgraded from 0007 to {SCHEMA_REVISION}\n")
    at_head = _cli(url, "--check")
    assert (at_head.returncode, at_head.stdout) == (0, f"at head: {SCHEMA_REVISION}\n")
    assert _cli(url, "--sql").stdout == ""
    bad = _cli(url, DATABASE_SCHEMA="Jobs")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "DATABASE_SCHEMA" in bad.stderr


# --- a deployment of the previous release ----------------------------------------------------


@pytest.fixture
def previous_release(empty_database_url: str) -> Iterator[str]:
    """A database as the previous release migrated it, holding jobs in several statuses."""
    rollout.previous_layout(empty_database_url)

    async def fill() -> None:
        conn = await rollout.connect(empty_database_url, "public")
        try:
            await rollout.fill(conn)
        finally:
            await conn.close()

    asyncio.run(fill())
    yield empty_database_url


def _counts(url: str, table: str) -> dict[str, int]:
    return dict(_sql(url, f"SELECT status, count(*) FROM {table} GROUP BY status"))  # type: ignore[arg-type]


class _PreviousRelease:
    """The previous release's API and worker at work: its submit, claim and completion,
    on sessions named as that release named them, `search_path` public."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.found = rollout.statements(releases.load(PREVIOUS))
        self.stop = threading.Event()
        self.connected = threading.Event()
        self.progress = threading.Event()  # set after each round
        self.errors: list[BaseException] = []
        self.submitted: list[Any] = []
        self.completed = 0
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()))

    async def _run(self) -> None:
        try:
            api = await asyncpg.connect(
                self.url, server_settings={"application_name": "jobqueue-api"}
            )
            worker = await asyncpg.connect(
                self.url, server_settings={"application_name": "jobqueue-worker"}
            )
        except BaseException as exc:
            self.errors.append(exc)
            self.connected.set()
            return
        self.connected.set()
        try:
            while not self.stop.is_set():
                job = rollout.new_job()
                (row,) = await self.found["submit"].fetch(api, job)
                self.submitted.append(row["id"])
                claimed = await self.found["claim"].fetch(
                    worker, await rollout.values(worker, "claim")
                )
                if claimed:
                    outcome = {
                        "ids": [r["id"] for r in claimed],
                        "tokens": [r["lease_token"] for r in claimed],
                        "results": ['{"ok": true}'] * len(claimed),
                        "lease_seconds": 30.0,
                    }
                    self.completed += len(await self.found["complete"].fetch(worker, outcome))
                self.progress.set()
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            await api.close()
            await worker.close()

    def __enter__(self) -> _PreviousRelease:
        self.thread.start()
        assert self.connected.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


def test_a_previous_release_deployment_is_adopted_by_one_command_while_it_runs(previous_release):
    """One `upgrade`, with the previous release submitting, claiming and completing all the
    while: it stops after 0008 (that release's sessions are connected), which moved the
    tables into the schema and left views in `public` that release goes on working through,
    with no error and no row lost; once it is gone, the next run reaches the head and
    `public` holds nothing of jobqueue's."""
    url = previous_release
    before = _counts(url, "public.jobs")
    with _PreviousRelease(url) as load:
        done = migrate.upgrade(url)
        after_move = len(load.submitted)
        # The load goes on through the views after the move.
        deadline = time.monotonic() + 30
        while len(load.submitted) < after_move + 20 and not load.errors:
            assert time.monotonic() < deadline, "the previous release stopped submitting"
            load.progress.wait(0.1)
            load.progress.clear()
    assert not load.errors, load.errors
    assert (done.before, done.after, done.deferred) == (PREVIOUS, "0008", 2)
    assert len(load.submitted) >= after_move + 20
    assert _sql(url, "SELECT version_num FROM jobqueue.alembic_version") == [("0008",)]
    assert "alembic_version" not in _relations(url, "public")  # ours was its only row
    # Nothing lost: every job there was, and every one the previous release submitted.
    ids = [str(i) for i in load.submitted]
    found = _sql(url, "SELECT count(*) FROM jobqueue.jobs WHERE id = ANY(%s::uuid[])", ids)
    assert found == [(len(ids),)]
    total = _sql(url, "SELECT count(*) FROM jobqueue.jobs")[0][0]
    assert total == sum(before.values()) + len(ids)
    # The rest of the upgrade, now that the previous release is gone.
    again = migrate.upgrade(url)
    assert (again.before, again.after, again.deferred) == ("0008", SCHEMA_REVISION, 0)
    assert _in_public_of_ours(url) == set()
    assert _relations(url, "public") == set()
    assert set(OURS) | {"alembic_version", "jobs_claim_queue_idx"} <= _relations(url, "jobqueue")


def test_the_deferral_says_so_and_check_reports_behind(previous_release):
    url = previous_release
    with psycopg.connect(url, application_name="jobqueue-worker-supervisor"):
        done = _cli(url)
        assert done.returncode == 0, done.stderr
        assert done.stdout == (
            "at 0008: the compatibility views stay for 1 sessions of the previous release;"
            " run `jobqueue migrate` again once they are gone\n"
        )
        behind = _cli(url, "--check")
        assert (behind.returncode, behind.stdout) == (
            1,
            f"behind: current 0008, wanted {SCHEMA_REVISION}\n",
        )
    done = _cli(url)
    assert (done.returncode, done.stdout) == (0, f"upgraded from 0008 to {SCHEMA_REVISION}\n")


def test_an_applications_version_table_is_kept_with_its_row(previous_release):
    url = previous_release
    _sql(url, "INSERT INTO public.alembic_version VALUES ('app0001')")
    migrate.upgrade(url)
    assert _sql(url, "SELECT version_num FROM public.alembic_version") == [("app0001",)]
    assert _sql(url, "SELECT version_num FROM jobqueue.alembic_version") == [(SCHEMA_REVISION,)]
    assert _in_public_of_ours(url) == set()


def test_downgrading_0009_and_0008_restores_the_previous_release_layout(previous_release):
    url = previous_release
    before = _counts(url, "public.jobs")
    migrate.upgrade(url)
    migrate.downgrade("0008", url)
    assert set(OURS) <= _relations(url, "public")  # the views again
    assert _counts(url, "public.jobs") == before
    migrate.downgrade("0007", url)
    assert set(OURS) | {"alembic_version", "jobs_claim_queue_idx"} <= _relations(url, "public")
    assert _sql(url, "SELECT version_num FROM public.alembic_version") == [("0007",)]
    assert _counts(url, "public.jobs") == before
    assert not set(OURS) & _relations(url, "jobqueue")
    # And up again from there.
    assert migrate.upgrade(url).after == SCHEMA_REVISION
    assert _in_public_of_ours(url) == set()
    assert _counts(url, "jobqueue.jobs") == before


def test_a_database_created_in_the_schema_downgrades_in_it_and_leaves_public_alone(
    empty_database_url: str,
):
    url = empty_database_url
    migrate.upgrade(url)
    migrate.downgrade("0007", url)
    assert _in_public_of_ours(url) == set()
    assert _relations(url, "public") == set()
    assert set(OURS) <= _relations(url, "jobqueue")
    assert migrate.upgrade(url).after == SCHEMA_REVISION
    assert _relations(url, "public") == set()


def test_an_applications_own_jobs_table_and_numbered_revision_are_not_taken_for_ours(
    empty_database_url: str,
):
    url = empty_database_url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.jobs (id serial PRIMARY KEY, title text)")
        conn.execute("CREATE TABLE public.alembic_version (version_num varchar(32) PRIMARY KEY)")
        conn.execute("INSERT INTO public.alembic_version VALUES ('0003')")
    assert migrate.upgrade(url).after == SCHEMA_REVISION
    assert _sql(url, "SELECT version_num FROM public.alembic_version") == [("0003",)]
    columns = _sql(
        url,
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = 'public' AND table_name = 'jobs' ORDER BY 1",
    )
    assert columns == [("id",), ("title",)]
    assert set(OURS) <= _relations(url, "jobqueue")


def test_past_the_views_no_session_defers_the_upgrade(empty_database_url):
    """The deferral keeps 0008's views for the release that works through them; a database
    already past 0009 has none, so sessions named like that release hold nothing back."""
    url = empty_database_url
    migrate.upgrade(url)
    migrate.downgrade("0009", url)
    with psycopg.connect(url, application_name="jobqueue-worker-supervisor"):
        done = migrate.upgrade(url)
    assert (done.before, done.after, done.deferred) == ("0009", SCHEMA_REVISION, 0)
