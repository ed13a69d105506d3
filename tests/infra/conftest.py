"""The replicated pair the failover tests run on: a primary and its synchronous standby,
migrated, removed after the test; and the services the pooler tests start (`stack`)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.infra.replication import Pair
from tests.procs import BIN


def migrate(url: str) -> None:
    migrated = subprocess.run(
        [str(BIN / "jobqueue"), "migrate"],
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr


@pytest.fixture
def pair() -> Iterator[Pair]:
    pair = Pair()
    try:
        pair.start()
        migrate(pair.url())
        yield pair
    finally:
        pair.cleanup()


@pytest.fixture
def stack() -> Iterator[Any]:
    """The API and worker services a test starts (`tests.infra.test_pgbouncer.Stack`),
    killed at its end if still alive."""
    from tests.infra.test_pgbouncer import Stack

    started = Stack()
    try:
        yield started
    finally:
        started.kill()
