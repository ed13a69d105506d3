"""`jobs_history`, where completed jobs move out of `jobs`: the move, the leaves (their
names and bounds, adding one) and retention there (docs/pressure.md, "History").

Each leaf holds the jobs that finished in one hour (or one day: `leaf_width`), and is named
after its bounds in UTC (`jobs_history_20261207t13_20261207t14`), so the leaves are listed
and ordered without parsing what PostgreSQL prints of their bounds. Retention drops a
leaf whole once its end is older than RETENTION_COMPLETED, and deletes row by row only in
the leaf that retention's cutoff falls in (`HISTORY_PRUNE`).

A DROP of a leaf takes an ACCESS EXCLUSIVE lock on `jobs_history`, which every reader of
finished jobs holds in ACCESS SHARE for its transaction: it waits at most
`DROP_LOCK_TIMEOUT`, so a long reader (a report, a `pg_dump`) makes retention try again
later, never makes the readers behind the DROP wait. Constructs and SQL text only;
`jobcore.compiled` runs them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from jobcore import naming
from jobcore.schema import jobs, jobs_history
from jobcore.states import Status

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
# A leaf per hour while retention keeps completed jobs for up to this long (24 leaves or
# more, the last one deleted from row by row), else per day (fewer leaves to look into
# for a job's record).
HOURLY_UP_TO = 2 * DAY
DROP_LOCK_TIMEOUT = "100ms"
# Above this many rows (as the leaf's statistics estimate them) a dropped leaf's rows are
# counted from the estimate, not one by one: a count would take longer than the drop.
EXACT_COUNT_UP_TO = 1_000_000

PREFIX = "jobs_history_"
_NAME = re.compile(r"^jobs_history_(\d{8}t\d{2})_(\d{8}t\d{2})$")
_STAMP = "%Y%m%dt%H"


@dataclass(frozen=True, order=True)
class Leaf:
    """One partition of `jobs_history`: the jobs that finished in [lower, upper)."""

    lower: datetime
    upper: datetime

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.lower.strftime(_STAMP)}_{self.upper.strftime(_STAMP)}"


def leaf_width(retention_seconds: float) -> timedelta:
    """How much time a new leaf covers under RETENTION_COMPLETED (0: kept forever)."""
    if 0 < retention_seconds <= HOURLY_UP_TO.total_seconds():
        return HOUR
    return DAY


def parse(name: str) -> Leaf | None:
    """The leaf a table name stands for; None for a name this module did not make."""
    found = _NAME.match(name)
    if found is None:
        return None
    lower, upper = (datetime.strptime(s, _STAMP).replace(tzinfo=UTC) for s in found.groups())
    return Leaf(lower, upper) if lower < upper else None


def leaf_at(moment: datetime, width: timedelta, leaves: list[Leaf]) -> Leaf:
    """The leaf to create for a job finished at `moment`: `width` aligned in UTC, cut back
    where it would overlap a leaf there is (made under another width)."""
    moment = moment.astimezone(UTC)
    if width >= DAY:
        lower = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    else:
        lower = moment.replace(minute=0, second=0, microsecond=0)
    upper = lower + width
    for leaf in leaves:
        if leaf.lower <= moment < leaf.upper:
            return leaf
        if leaf.upper <= moment:
            lower = max(lower, leaf.upper)
        else:
            upper = min(upper, leaf.lower)
    return Leaf(lower, upper)


def expired(leaves: list[Leaf], cutoff: datetime) -> list[Leaf]:
    """The leaves every job of which finished before `cutoff`, oldest first."""
    return sorted(leaf for leaf in leaves if leaf.upper <= cutoff)


# A completed job moves once it has been finished this long: the jobs just finished are the
# ones read the most (by waiters, pollers, the dashboard), and `jobs` then holds a minute of
# them at most, which costs the claim nothing.
MOVE_AFTER = 60.0
# Where a read of the movable jobs starts that does not start at the head: this long
# before the newest job the last batch moved. A job that finished earlier but committed
# later than that (its transaction took longer) is found by the next read from the head.
MOVE_MARGIN = timedelta(seconds=10)
# How far back the move reaches: completed jobs older than this (or than retention, if it
# is shorter: retention deletes those from `jobs`) stay where they are, so an upgrade of a
# deployment that keeps years of jobs does not make a leaf for each of those days.
MOVE_LOOKBACK = 7 * DAY


def move_start(oldest: datetime, now: datetime, retention_seconds: float) -> datetime:
    """Where the move starts: at the oldest movable job, within MOVE_LOOKBACK (or the
    retention, if shorter) of now."""
    reach = MOVE_LOOKBACK
    if retention_seconds > 0:
        reach = min(reach, timedelta(seconds=retention_seconds))
    return max(oldest, now - reach)


def leaves_to_add(
    leaves: list[Leaf], start: datetime, now: datetime, width: timedelta
) -> list[Leaf]:
    """The leaves missing for the jobs that finished from `start` to the end of the leaf
    after the current one (so a job finishing as the hour turns has its leaf already),
    oldest first: with the existing ones, they cover that span without a gap."""
    missing: list[Leaf] = []
    present = list(leaves)
    moment = start
    while True:
        leaf = leaf_at(moment, width, present)
        if leaf not in present:
            missing.append(leaf)
            present.append(leaf)
        if leaf.lower > now:
            return missing
        moment = leaf.upper


# The leaves there are, by name (the caller parses them).
HISTORY_LIST_LEAVES = sa.text(
    """
SELECT c.relname AS name FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = CAST(:parent AS regclass)"""
).columns(sa.column("name", sa.Text))

# The jobs of the leaf that retention's cutoff falls in (the leaves wholly before it are
# dropped): at most PRUNE_BATCH of those that finished more than `age` seconds ago, oldest
# first, through the leaves' `finished_at` index; how many. Nobody else writes these rows
# (no operation starts from completed), so no row lock is waited for or taken first.
HISTORY_PRUNE = sa.text(
    """
WITH gone AS (
    DELETE FROM jobqueue.jobs_history
    WHERE finished_at < now() - CAST(:age AS float8) * interval '1 second'
      AND id = ANY(ARRAY(
        SELECT id FROM jobqueue.jobs_history
        WHERE finished_at < now() - CAST(:age AS float8) * interval '1 second'
        ORDER BY finished_at LIMIT :batch))
    RETURNING 1
)
SELECT count(*) AS pruned FROM gone"""
).columns(sa.column("pruned", sa.BigInteger))


_MOVED = ", ".join(jobs.c.keys())
# The move: at most `batch` completed jobs without a key that finished in [since, until),
# oldest first, deleted from `jobs` and inserted into `jobs_history` in one statement (a
# reader's snapshot sees each in one table or the other); how many, and when the newest of
# them finished (where the mover's next read may start). Every column is named:
# the two tables' columns are the same, in whatever order each was built. A row another
# transaction holds is skipped (retention's prune of `jobs`); nothing else writes a
# completed job. Read through `jobs_movable_idx`, which holds exactly those jobs.
HISTORY_MOVE = (
    sa.text(
        f"""
WITH moved AS (
    DELETE FROM jobqueue.jobs WHERE id = ANY(ARRAY(
        SELECT id FROM jobqueue.jobs
        WHERE status = '{Status.COMPLETED.value}' AND idempotency_key IS NULL
          AND finished_at >= :since AND finished_at < :until
        ORDER BY finished_at LIMIT :batch
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING {_MOVED}
), kept AS (
    INSERT INTO jobqueue.jobs_history ({_MOVED}) SELECT {_MOVED} FROM moved
    RETURNING finished_at
)
SELECT count(*) AS moved, max(finished_at) AS newest FROM kept"""
    )
    .bindparams(
        sa.bindparam("since", type_=sa.DateTime(timezone=True)),
        sa.bindparam("until", type_=sa.DateTime(timezone=True)),
        sa.bindparam("batch", type_=sa.Integer),
    )
    .columns(sa.column("moved", sa.BigInteger), sa.column("newest", sa.DateTime(timezone=True)))
)

# When the oldest job the move would take, of those that finished at `since` or later,
# finished (NULL: none), and the database's now. Under a held MVCC horizon the head of
# `jobs_movable_idx` keeps an entry for every job moved since, which a read from the head
# visits: the mover starts where its last batch ended (`MOVE_MARGIN`).
HISTORY_GET_OLDEST = (
    sa.text(
        f"""
SELECT (SELECT min(finished_at) FROM jobqueue.jobs
        WHERE status = '{Status.COMPLETED.value}' AND idempotency_key IS NULL
          AND finished_at >= :since) AS oldest,
       now() AS now"""
    )
    .bindparams(sa.bindparam("since", type_=sa.DateTime(timezone=True)))
    .columns(
        sa.column("oldest", sa.DateTime(timezone=True)),
        sa.column("now", sa.DateTime(timezone=True)),
    )
)


def parent() -> str:
    """`jobs_history` in this process's schema."""
    return naming.translate(jobs_history.fullname)


def qualified(leaf: Leaf) -> str:
    return f"{parent().rsplit('.', 1)[0]}.{leaf.name}"


def create_sql(leaf: Leaf) -> list[str]:
    """The statements that add `leaf`, in one transaction: a table like the parent, with
    the leaf's bound as a constraint (so attaching reads nothing), attached. ATTACH takes
    a SHARE UPDATE EXCLUSIVE lock on the parent, which its readers and writers do not
    wait for (a CREATE TABLE ... PARTITION OF would take ACCESS EXCLUSIVE)."""
    lower, upper = (f"'{t.isoformat()}'" for t in (leaf.lower, leaf.upper))
    return [
        f"SET LOCAL lock_timeout = '{DROP_LOCK_TIMEOUT}'",
        f"CREATE TABLE {qualified(leaf)} (LIKE {parent()} INCLUDING DEFAULTS"
        f" INCLUDING CONSTRAINTS, CONSTRAINT {leaf.name}_bound CHECK"
        f" (finished_at >= {lower} AND finished_at < {upper}))",
        f"ALTER TABLE {parent()} ATTACH PARTITION {qualified(leaf)}"
        f" FOR VALUES FROM ({lower}) TO ({upper})",
    ]


def count_sql(leaf: Leaf) -> str:
    """How many jobs `leaf` holds: counted, or above EXACT_COUNT_UP_TO as estimated."""
    return (
        f"SELECT CASE WHEN reltuples <= {EXACT_COUNT_UP_TO}"
        f" THEN (SELECT count(*) FROM {qualified(leaf)}) ELSE reltuples::bigint END AS n"
        f" FROM pg_class WHERE oid = CAST('{qualified(leaf)}' AS regclass)"
    )


def drop_sql(leaf: Leaf) -> list[str]:
    """The statements that drop `leaf`, waiting for the lock at most DROP_LOCK_TIMEOUT."""
    return [
        f"SET LOCAL lock_timeout = '{DROP_LOCK_TIMEOUT}'",
        f"DROP TABLE {qualified(leaf)}",
    ]


# By their SQL name, for `jobcore.queries.named()`.
NAMED = {
    "history_list_leaves": HISTORY_LIST_LEAVES,
    "history_prune": HISTORY_PRUNE,
    "history_move": HISTORY_MOVE,
    "history_get_oldest": HISTORY_GET_OLDEST,
}
