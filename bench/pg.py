"""The PostgreSQL server the benchmark runs on: one throwaway database per system and run."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

DEFAULT_SERVER = "postgresql://127.0.0.1:5432/postgres"
PREFIX = "jq_bench_"
# Every job jobqueue keeps, wherever it is: the workers move completed jobs from `jobs` to
# `jobs_history` (the same columns, in the same order) soon after they finish.
RETAINED = "(SELECT * FROM jobqueue.jobs UNION ALL SELECT * FROM jobqueue.jobs_history) AS jobs"
ROOT = Path(__file__).resolve().parent.parent


def server_url() -> str:
    """$BENCH_DATABASE_URL, else the local server on 127.0.0.1:5432, else the embedded one
    `make run` and the tests use (scripts/devdb.py decides)."""
    url = os.environ.get("BENCH_DATABASE_URL")
    if url:
        return url
    found = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "devdb.py"), "test-url"],
        capture_output=True,
        text=True,
    )
    return (
        found.stdout.strip() if found.returncode == 0 and found.stdout.strip() else DEFAULT_SERVER
    )


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


_created = itertools.count(1)


def database_name(system: str) -> str:
    """A name no other database of this or another run has; ends with this process's pid,
    which tells a later run which databases belong to a benchmark that died."""
    return f"{PREFIX}{system}_{next(_created)}_{os.getpid()}"


async def _admin(server: str) -> asyncpg.Connection:
    return await asyncpg.connect(server)


async def create(server: str, name: str) -> str:
    """(Re)create database `name`; returns its URL."""
    conn = await _admin(server)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return with_database(server, name)


async def drop(server: str, name: str) -> None:
    conn = await _admin(server)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def drop_stale(server: str) -> list[str]:
    """Drop benchmark databases left behind by runs whose process no longer exists."""
    conn = await _admin(server)
    dropped = []
    try:
        names = await conn.fetch(
            "SELECT datname FROM pg_database WHERE starts_with(datname, $1)", PREFIX
        )
        for (name,) in names:
            match = re.search(r"_(\d+)$", name)
            if match and not _alive(int(match.group(1))):
                with contextlib.suppress(asyncpg.PostgresError):
                    await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    dropped.append(name)
    finally:
        await conn.close()
    return dropped
