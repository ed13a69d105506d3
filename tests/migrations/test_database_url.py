"""`alembic upgrade head` takes the same DATABASE_URL as the services: libpq parameters
are translated, unsupported ones refused in one clear line."""

from __future__ import annotations

import os
import subprocess

import pytest
from alembic import command
from alembic.util import CommandError

from jobcore.schema import SCHEMA_REVISION
from tests import pg
from tests.migrations.test_migrations import _state
from tests.procs import BIN


def alembic(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "alembic"), *args],
        cwd=pg.ROOT,
        env={**os.environ, "DATABASE_URL": url},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )


def test_upgrade_with_libpq_parameters_in_the_url(empty_database_url):
    url = (
        f"{empty_database_url}?sslmode=prefer&connect_timeout=5&application_name=migrate"
        "&options=-c%20lock_timeout%3D30s&target_session_attrs=read-write"
    )
    done = alembic(url, "upgrade", "head")
    assert done.returncode == 0, done.stdout
    assert _state(empty_database_url) == (SCHEMA_REVISION, True)


def test_an_unsupported_parameter_fails_in_one_line_naming_it_without_a_traceback(
    empty_database_url,
):
    done = alembic(f"{empty_database_url}?foo=bar", "upgrade", "head")
    assert done.returncode != 0
    assert "FAILED: invalid configuration: DATABASE_URL: parameter 'foo'" in done.stdout
    assert "Traceback" not in done.stdout
    assert _state(empty_database_url) == (None, False)


def test_the_programmatic_api_raises_a_command_error(empty_database_url):
    with pytest.raises(CommandError, match="sslmode"):
        command.upgrade(pg.alembic_config(f"{empty_database_url}?sslmode=sometimes"), "head")
