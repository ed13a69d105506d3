"""The statements each earlier release ran, taken from git history and kept as fixtures.

A migration must keep the previous release's services working while a rollout replaces
them (docs/upgrading.md). To test that, the tests need that release's SQL. There are no
release tags, so a release is named by its schema revision:

    the release at revision R = the last commit whose services expect R: the parent of
    the commit that added the revision after R (HEAD while that revision is uncommitted).

Its services refuse to start on any other schema, so that is the code that is running
against the new schema during the rollout to the revision after R.

For each released revision R before the head, `release_sql/R.json` holds the hot
statements of the release at R (the worker's: claim, renew, the outcome writes, recovery,
retention, the KEY_CONCURRENCY lock; the API's: submit, get), compiled for asyncpg exactly
as that release compiled them, with the commit they come from. The tests run them against
newer schemas (tests/migrations/test_previous_release.py). `test_the_fixtures_match_git_history`
regenerates them from the named commits when the history is there (a CI clone has it)
and fails when they are stale. After adding a revision, run

    .venv/bin/python -m tests.migrations.releases

to write the fixture of the release it replaces; `--check` only compares.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
FIXTURES = Path(__file__).resolve().parent / "release_sql"
VERSIONS = ROOT / "migrations" / "versions"

# Run in a separate interpreter whose `jobcore` is the release's (its `shared/` first on
# sys.path): the statements, by name, compiled with SQLAlchemy's asyncpg dialect, which is
# what every release's worker and API sent (through SQLAlchemy or `jobcore.compiled`).
_EXTRACT = r"""
import json, sys
import jobcore
assert jobcore.__file__.startswith(sys.argv[1]), jobcore.__file__
from jobcore import schema, store
from sqlalchemy.dialects.postgresql.asyncpg import dialect

_DIALECT = dialect()


def compiled(statement):
    keys = None
    if (getattr(statement, "is_insert", False) and not statement._values
            and statement.select is None and not statement._multi_values):
        # The first releases' SUBMIT had no values: SQLAlchemy compiled it for the keys
        # `submit` passed, NewJob's fields.
        new = store.NewJob
        keys = list(getattr(new, "__dataclass_fields__", None) or new._fields)
    c = statement.compile(dialect=_DIALECT, column_keys=keys)
    params = [
        [name, c.binds[name].required, None if c.binds[name].required
         else c.binds[name].effective_value]
        for name in c.positiontup or ()
    ]
    return {"sql": c.string, "params": params}


found = {}
try:  # since the statements live in jobcore.queries, by their SQL names
    from jobcore import queries
    named = queries.named()
except (ImportError, AttributeError):
    named = None
worker = getattr(store, "WORKER_STATEMENTS", None)
if named is not None:
    for name, statement in named.items():
        if name.startswith("job_set_outcome_"):
            found[name.removeprefix("job_set_outcome_")] = statement
        elif name.startswith("job_prune_"):
            found["prune_" + name.removeprefix("job_prune_")] = statement
        elif name in ("job_claim", "job_complete_and_claim", "job_release_claim",
                      "job_recover_expired", "job_submit", "job_get", "job_next_due",
                      "job_lock_keys"):
            found[name.removeprefix("job_")] = statement
        elif name == "job_renew_many":
            found["renew"] = statement
elif worker is not None:
    found.update((str(name), statement) for name, statement in worker.items())
else:  # the first releases had module constants only
    for name in ("CLAIM", "COMPLETE", "FAIL", "DEAD_LETTER", "RETRY_LATER", "RELEASE",
                 "RELEASE_CLAIM", "COMPLETE_AND_CLAIM", "RECOVER_EXPIRED", "RENEW"):
        if hasattr(store, name):
            found[name.lower()] = getattr(store, name)
for name, statement in getattr(store, "OUTCOME_WRITES", {}).items() if named is None else ():
    found.setdefault(str(name), statement)
for name in ("SUBMIT", "SUBMIT_AND_NOTIFY", "SUBMIT_MANY", "SUBMIT_MANY_KEYLESS",
             "SUBMIT_GROUP", "SUBMIT_GROUP_AND_NOTIFY", "GET_BY_KEYS", "GET"):
    if hasattr(store, name):
        found[name.lower()] = getattr(store, name)
try:
    from jobcore import maintenance
except ImportError:
    pass
else:
    for status, statement in getattr(maintenance, "PRUNE", {}).items():
        found[f"prune_{status}"] = statement
out = {"schema_revision": schema.SCHEMA_REVISION,
       "statements": {name: compiled(s) for name, s in sorted(found.items())}}
json.dump(out, sys.stdout, indent=1, sort_keys=True)
"""


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True
    ).stdout


def revisions() -> dict[str, tuple[str | None, Path]]:
    """Each revision of migrations/versions: its down_revision and its file."""
    out: dict[str, tuple[str | None, Path]] = {}
    for path in sorted(VERSIONS.glob("*.py")):
        scope: dict[str, Any] = {}
        # Only the assignments at the top: revision and down_revision are plain literals.
        lines = [
            line
            for line in path.read_text().splitlines()
            if line.startswith(("revision:", "down_revision:"))
        ]
        exec("\n".join(lines), scope)
        out[scope["revision"]] = (scope["down_revision"], path)
    return out


def head() -> str:
    nodes = revisions()
    downs = {down for down, _ in nodes.values()}
    (last,) = [rev for rev in nodes if rev not in downs]
    return last


# Revisions that no release stopped at: they came with the revision after them, in one
# release. 0008 moved the tables into jobqueue's schema and left views for the previous
# release; 0009, the same release's, drops them (its services work on either).
WITHIN_A_RELEASE = frozenset({"0008"})


def released_before_head() -> list[str]:
    """The revisions that have a release after which another revision came, oldest first."""
    nodes = revisions()
    chain: list[str] = []
    rev: str | None = head()
    while rev is not None:
        chain.append(rev)
        rev = nodes[rev][0]
    return [rev for rev in list(reversed(chain))[:-1] if rev not in WITHIN_A_RELEASE]


def rolled_out_to(revision: str) -> str:
    """The revision a rollout replacing the release at `revision` runs against while that
    release's services remain: the next one, or, when the next release has several, the
    last before its head (the one that keeps the old release working)."""
    following = next_revision(revision)
    while following in WITHIN_A_RELEASE and next_revision(following) in WITHIN_A_RELEASE:
        following = next_revision(following)
    return following


def release_commit(revision: str) -> str:
    """The last commit whose services expect `revision` (see the module docstring)."""
    path = revisions()[next_revision(revision)][1].relative_to(ROOT)
    added = git("log", "--diff-filter=A", "--format=%H", "--", str(path)).split()
    if not added:  # the next revision is not committed yet: the release at R is HEAD
        return git("rev-parse", "HEAD").strip()
    return git("rev-parse", f"{added[-1]}^").strip()


def extract(commit: str) -> dict[str, Any]:
    """The statements of the code at `commit` (see _EXTRACT)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "shared"],
        check=True,
        capture_output=True,
    ).stdout
    with tempfile.TemporaryDirectory(prefix="jq-release-") as tmp:
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        return _run_extract(Path(tmp) / "shared")


def extract_working_tree() -> dict[str, Any]:
    """The statements of this checkout's code: what the next release will run."""
    return _run_extract(ROOT / "shared")


def _run_extract(shared: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(shared), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _EXTRACT, str(shared)],
        cwd=shared.parent,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(done.stdout))


def next_revision(revision: str) -> str:
    """The revision that follows `revision`."""
    (following,) = [rev for rev, (down, _) in revisions().items() if down == revision]
    return following


def generate(revision: str) -> dict[str, Any]:
    commit = release_commit(revision)
    found = extract(commit)
    if found["schema_revision"] != revision:
        raise RuntimeError(
            f"the code at {commit[:12]} expects {found['schema_revision']}, not {revision}"
        )
    return {
        "revision": revision,
        "commit": commit,
        "subject": git("log", "-1", "--format=%s", commit).strip()[:120],
        "statements": found["statements"],
    }


def fixture_path(revision: str) -> Path:
    return FIXTURES / f"{revision}.json"


def render(fixture: dict[str, Any]) -> str:
    return json.dumps(fixture, indent=1, sort_keys=True) + "\n"


def load(revision: str) -> dict[str, Any]:
    """The stored statements of the release at `revision`."""
    return dict(json.loads(fixture_path(revision).read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    parser.add_argument("revisions", nargs="*", help="default: every release before the head")
    args = parser.parse_args(argv)
    stale = []
    for revision in args.revisions or released_before_head():
        text = render(generate(revision))
        path = fixture_path(revision)
        if path.exists() and path.read_text() == text:
            continue
        stale.append(revision)
        if not args.check:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run python -m tests.migrations.releases")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
