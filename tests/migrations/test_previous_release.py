"""A migration keeps the previous release's services working during the rollout
(docs/upgrading.md): that release's hot statements, taken from git history
(`tests.migrations.releases`), run against a database migrated to the revision after it,
filled like a busy queue, read through an index in custom and generic plans, and do what
they did.

The release before the head is the one that matters now; every earlier step is checked
too, and the one that broke the rule (0003 dropped the index the release before it
claimed through) is pinned as the known exception it is, with the documented way around
it shown to work.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from alembic import command
from sqlalchemy.engine import make_url

from jobcore import compiled, queries
from jobcore.ids import new_id
from jobcore.rows import job_from_row
from jobcore.runner import Compiled
from jobcore.states import FINISHED, Status
from tests import pg
from tests.migrations import releases, rollout
from tests.migrations.rollout import QUEUES, SLOTS, Statement

HEAD = releases.head()
RELEASED = releases.released_before_head()
PREVIOUS = RELEASED[-1]

# The releases whose statements their next revision broke, and which: a revision is
# released once it is in the history, so this only records what was shipped (and what
# docs/upgrading.md tells an operator still upgrading across it to do). Never add to it.
KNOWN_BROKEN = {
    # 0003 dropped jobs_claim_idx (run_at, id), which the 0002 release claims through.
    "0002": {"claim", "complete_and_claim"},
}
# What docs/upgrading.md tells an operator upgrading from a release before 0003 to run
# first: a copy of the old claim index, under a name no revision drops.
LEGACY_CLAIM_INDEX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_claim_legacy_idx"
    " ON jobs (run_at, id) WHERE status = 'pending'"
)


async def _migrated(
    pg_server: str, databases: list[str], revision: str, before: str | None = None
) -> str:
    """A new database at `revision`, filled; with `before`, SQL run at the revision before
    `revision` (then the fill happens there, and the upgrade runs over a populated table)."""
    url = pg.with_database(pg_server, pg.create_database(pg_server, None))
    databases.append(url)
    config = pg.alembic_config(url)
    if before is None:
        await asyncio.to_thread(command.upgrade, config, revision)
        conn = await rollout.connect(url)
        try:
            await rollout.fill(conn)
        finally:
            await conn.close()
        return url
    down = releases.revisions()[revision][0]
    assert down is not None
    await asyncio.to_thread(command.upgrade, config, down)
    conn = await rollout.connect(url)
    try:
        await rollout.fill(conn)
        await conn.execute(before)
    finally:
        await conn.close()
    await asyncio.to_thread(command.upgrade, config, revision)
    conn = await rollout.connect(url)
    try:
        await conn.execute("ANALYZE jobs")
    finally:
        await conn.close()
    return url


@pytest.fixture
async def databases(pg_server: str) -> AsyncIterator[list[str]]:
    """Databases this test makes (`_migrated`), dropped at the end."""
    made: list[str] = []
    yield made
    for url in made:
        database = make_url(url).database
        assert database is not None
        pg.drop_database(pg_server, database)


def _release(revision: str) -> dict[str, Statement]:
    return rollout.statements(releases.load(revision))


def _shown(found: dict[str, Any]) -> str:
    return "\n".join(
        f"{name} ({kind}): {', '.join(what)}\n{json.dumps(plan)[:4000]}"
        for name, runs in found.items()
        for kind, what, plan in runs
    )


# --- what a release's hot statements must still do ---------------------------------------


async def _claim_order(conn: asyncpg.Connection, by_queue: bool, n: int) -> list[Any]:
    """The ids a claim of `n` (per queue in QUEUES with SLOTS) takes, in the claim order of
    the release (with queues: priority first)."""
    if not by_queue:
        rows = await conn.fetch(
            "SELECT id FROM jobs WHERE status = 'pending' AND run_at <= now()"
            " ORDER BY run_at, id LIMIT $1",
            n,
        )
        return [r[0] for r in rows]
    out = []
    for queue, slots in zip(QUEUES, SLOTS, strict=True):
        rows = await conn.fetch(
            "SELECT id FROM jobs WHERE status = 'pending' AND run_at <= now() AND queue = $1"
            " ORDER BY priority DESC, run_at, id LIMIT $2",
            queue,
            slots,
        )
        out.extend(r[0] for r in rows)
    return out


async def _hot_path(conn: asyncpg.Connection, found: dict[str, Statement]) -> dict[str, Any]:
    """submit (twice: the replay), get, claim, renew and complete as the release ran them,
    each checked against the table; returns what they touched."""
    values = await rollout.values(conn, "submit")
    values["idempotency_key"] = f"rollout-{values['id']}"
    submitted = await found["submit"].fetch(conn, values)
    assert len(submitted) == 1 and submitted[0]["created"], submitted
    assert submitted[0]["id"] == values["id"] and submitted[0]["status"] == "pending"
    replay = await found["submit"].fetch(conn, {**values, "id": new_id()})
    assert [(r["id"], r["created"]) for r in replay] == [(values["id"], False)]

    (got,) = await found["get"].fetch(conn, {"id": values["id"]})
    assert (got["id"], got["type"], json.loads(got["payload"])) == (
        values["id"],
        "sleep",
        {"rollout": True},
    )

    claim = found["claim"]
    by_queue = "queues" in claim.parameters
    n = sum(SLOTS) if by_queue else 10
    async with conn.transaction():  # one now() for the expected order and the claim
        expected = await _claim_order(conn, by_queue, n)
        claimed = await claim.fetch(conn, await rollout.values(conn, "claim"))
    assert sorted(r["id"] for r in claimed) == sorted(expected) and len(expected) == n
    leases = {r["id"]: r["lease_token"] for r in claimed}
    rows = await conn.fetch(
        "SELECT id, status, lease_token, locked_until > now() AS held FROM jobs"
        " WHERE id = ANY($1::uuid[])",
        list(leases),
    )
    assert {(r["id"], r["status"], r["lease_token"], r["held"]) for r in rows} == {
        (job, "processing", token, True) for job, token in leases.items()
    }

    ids, tokens = list(leases), list(leases.values())
    outcome = {
        "ids": ids,
        "tokens": tokens,
        "results": ['{"ok": true}'] * len(ids),
        "lease_seconds": 120.0,
    }
    if "renew" in found:  # releases before 0004 had no heartbeat
        renewed = await found["renew"].fetch(conn, outcome)
        assert {(r["id"], r["lease_token"]) for r in renewed} == set(leases.items())
        longer = await conn.fetchval(
            "SELECT bool_and(locked_until > now() + interval '100 seconds') FROM jobs"
            " WHERE id = ANY($1::uuid[])",
            ids,
        )
        assert longer

    stale = await found["complete"].fetch(conn, {**outcome, "tokens": [t - 1 for t in tokens]})
    assert stale == []  # fenced: an older lease writes nothing
    completed = await found["complete"].fetch(conn, outcome)
    assert {r["id"] for r in completed} == set(leases)  # the first release returned ids only
    assert all(r.get("lease_token", leases[r["id"]]) == leases[r["id"]] for r in completed)
    done = await conn.fetch("SELECT status, locked_until FROM jobs WHERE id = ANY($1::uuid[])", ids)
    assert {(r["status"], r["locked_until"]) for r in done} == {("completed", None)}
    return {"submitted": values["id"], "completed": ids}


async def _this_release_reads(conn: asyncpg.Connection, touched: dict[str, Any]) -> None:
    """What the release at the head makes of the rows the previous one wrote: it reads them
    (`queries.JOB_GET`, as the API does) and retention deletes the jobs it finished."""
    get = Compiled(queries.JOB_GET)
    for job_id in [touched["submitted"], *touched["completed"]]:
        (row,) = await conn.fetch(get.sql, *get.args({"id": job_id}))
        job = job_from_row(row)
        assert job.id == job_id
        assert job.status in {Status.PENDING, Status.COMPLETED}
    # Retention with an age of 0: everything finished before this statement.
    while await compiled.prune(conn, Status.COMPLETED, 0.0):
        pass
    left = await conn.fetchval(
        "SELECT count(*) FROM jobs WHERE id = ANY($1::uuid[])", touched["completed"]
    )
    assert left == 0


# --- the tests ----------------------------------------------------------------------------


def test_there_is_a_fixture_for_every_release_before_the_head():
    """A new revision needs the statements of the release it replaces: `python -m
    tests.migrations.releases` writes them (the module's docstring says how)."""
    stored = sorted(path.stem for path in releases.FIXTURES.glob("*.json"))
    assert stored == RELEASED, "run: .venv/bin/python -m tests.migrations.releases"
    for revision in RELEASED:
        fixture = releases.load(revision)
        assert fixture["revision"] == revision
        assert {"claim", "complete", "submit", "get"} <= set(fixture["statements"])


def _history() -> bool:
    try:
        shallow = releases.git("rev-parse", "--is-shallow-repository").strip()
    except (OSError, subprocess.CalledProcessError):
        return False
    return shallow == "false"


@pytest.mark.skipif(not _history(), reason="needs the repository's git history")
@pytest.mark.parametrize("revision", RELEASED)
def test_the_fixtures_are_what_git_history_holds(revision):
    """Each fixture names the last commit whose services expect its revision, and holds
    exactly what that commit's code compiles."""
    fixture = releases.load(revision)
    assert fixture["commit"] == releases.release_commit(revision), (
        "the release's commit moved (a rebase?): run .venv/bin/python -m tests.migrations.releases"
    )
    assert releases.render(releases.generate(revision)) == releases.render(fixture), (
        "stale: run .venv/bin/python -m tests.migrations.releases"
    )


async def _rolled_out(pg_server: str, databases: list[str]) -> str:
    """The previous release's database (its tables in `public`), filled, then migrated by
    this release as a rollout does while that release still runs: adopted into the schema
    and stopped at 0008, whose views in `public` the previous release goes through."""
    url = pg.with_database(pg_server, pg.create_database(pg_server, None))
    databases.append(url)
    await asyncio.to_thread(rollout.previous_layout, url)
    conn = await rollout.connect(url, "public")
    try:
        await rollout.fill(conn)
    finally:
        await conn.close()
    target = releases.rolled_out_to(PREVIOUS)
    await asyncio.to_thread(command.upgrade, pg.alembic_config(url), target)
    return url


async def test_the_previous_release_works_on_the_head_schema(pg_server, databases):
    """The rollout to the head: the release before it, its sessions at `search_path`
    public, goes through 0008's views (reading through an index), its hot path does what it
    did, and this release reads and retires what it wrote."""
    found = _release(PREVIOUS)
    if PREVIOUS >= "0008":  # its tables are in the schema already: no views to go through
        url = await _migrated(pg_server, databases, releases.rolled_out_to(PREVIOUS))
        conn = await rollout.connect(url)
    else:
        conn = await rollout.connect(await _rolled_out(pg_server, databases), "public")
    try:
        bad = await rollout.problems(conn, found)
        assert not bad, _shown(bad)
        touched = await _hot_path(conn, found)
        await _this_release_reads(conn, touched)
    finally:
        await conn.close()


@pytest.mark.parametrize("revision", RELEASED[:-1])
async def test_each_earlier_release_worked_on_the_revision_after_it(pg_server, databases, revision):
    """Every step of the history, as its rollout ran: the release at `revision` against the
    revision after it. Only 0003's drop of the old claim index broke the rule."""
    found = _release(revision)
    url = await _migrated(pg_server, databases, releases.next_revision(revision))
    conn = await rollout.connect(url)
    try:
        bad = await rollout.problems(conn, found)
        assert set(bad) == KNOWN_BROKEN.get(revision, set()), _shown(bad)
        for runs in bad.values():  # and what broke is the scan the old index saved
            assert all(any("Seq Scan" in p for p in what) for _, what, _ in runs)
        await _hot_path(conn, found)
    finally:
        await conn.close()


async def test_the_copy_of_the_old_claim_index_keeps_a_release_before_0003_claiming_through_it(
    pg_server, databases
):
    """docs/upgrading.md: an operator upgrading from a release before 0003 while its workers
    run creates a copy of jobs_claim_idx first; 0003 drops only the original."""
    found = _release("0002")
    url = await _migrated(pg_server, databases, "0003", before=LEGACY_CLAIM_INDEX)
    conn = await rollout.connect(url)
    try:
        bad = await rollout.problems(conn, found)
        assert not bad, _shown(bad)
        await _hot_path(conn, found)
    finally:
        await conn.close()


async def test_this_release_passes_the_same_checks_on_its_own_schema(pg_server, databases):
    """The statements of this checkout, compiled as the fixture of the next revision will
    hold them, pass the checks on the head: the values above cover every parameter they
    take, and their generic plans read through an index too."""
    found = rollout.statements(releases.extract_working_tree())
    conn = await rollout.connect(await _migrated(pg_server, databases, HEAD))
    try:
        bad = await rollout.problems(conn, found)
        assert not bad, _shown(bad)
        await _hot_path(conn, found)
    finally:
        await conn.close()


# --- defect: jobs finished by the release before 0005 were never pruned ----------------


@pytest.mark.parametrize("outcome", ["complete", "fail", "dead_letter"])
async def test_a_job_the_release_before_0005_finished_is_pruned_once_older_than_retention(
    pg_server, databases, outcome
):
    """During the rollout to 0005 the 0004 release's workers finish jobs the way they always
    did: status and updated_at, no finished_at (a column they do not know). Once upgraded,
    retention ages them from updated_at, when they finished, like any other."""
    found = _release("0004")
    status = {"complete": "completed", "fail": "failed", "dead_letter": "dead_letter"}[outcome]
    url = pg.with_database(pg_server, pg.create_database(pg_server, None))
    databases.append(url)
    await asyncio.to_thread(command.upgrade, pg.alembic_config(url), "0005")
    conn = await rollout.connect(url)
    try:
        # Two jobs submitted three days ago (their ids say when), run by the 0004 release.
        now_ms = int(await conn.fetchval("SELECT extract(epoch FROM now()) * 1000"))
        old, young = (rollout.uuid7_at(now_ms - 3 * 86_400_000) for _ in range(2))
        for job_id in (old, young):
            await found["submit"].fetch(conn, rollout.new_job(job_id))
        claimed = await found["claim"].fetch(conn, await rollout.values(conn, "claim"))
        assert {r["id"] for r in claimed} == {old, young}
        leases = {
            "ids": [r["id"] for r in claimed],
            "tokens": [r["lease_token"] for r in claimed],
            "errors": ["boom"] * 2,
        }
        assert len(await found[outcome].fetch(conn, leases)) == 2
        rows = await conn.fetch("SELECT status, finished_at FROM jobs")
        assert {(r["status"], r["finished_at"]) for r in rows} == {(status, None)}
        # One finished two days ago, the other an hour ago (the 0004 release wrote only
        # updated_at).
        await conn.execute(
            "UPDATE jobs SET updated_at = now() - CASE id WHEN $1 THEN interval '2 days'"
            " ELSE interval '1 hour' END",
            old,
        )
    finally:
        await conn.close()
    await asyncio.to_thread(command.upgrade, pg.alembic_config(url), "head")
    conn = await rollout.connect(url)
    try:
        assert await compiled.prune(conn, Status(status), 86400.0) == 1
        assert [r["id"] for r in await conn.fetch("SELECT id FROM jobs")] == [young]
        # The other statuses' prunes leave it alone.
        for other in sorted(FINISHED - {Status(status)}):
            assert await compiled.prune(conn, other, 60.0) == 0
    finally:
        await conn.close()
