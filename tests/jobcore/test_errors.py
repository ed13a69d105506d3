"""jobcore.errors: typed errors carry what an operator needs; describe() names the type; every
error the project defines (jobcore and both services) is a JobqueueError, with a name of its own."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import asyncpg
import pytest
import sqlalchemy.exc as sa_exc

import jobcore
from jobcore import client, validation
from jobcore.db import asyncpg_dsn
from jobcore.errors import (
    POOLER_HINT,
    ConfigError,
    IdempotencyConflict,
    InvalidRequest,
    JobqueueError,
    SchemaNotAtHead,
    describe,
    pooled_statements_lost,
)


def test_describe_names_the_type_and_the_message():
    assert describe(ValueError("bad input ")) == "ValueError: bad input"
    assert describe(TimeoutError()) == "TimeoutError"


def test_errors_name_what_to_act_on():
    config = ConfigError("LEASE_DURATION", "must be at least 3s")
    assert (config.variable, str(config)) == (
        "LEASE_DURATION",
        "LEASE_DURATION: must be at least 3s",
    )
    assert "order-42" in str(IdempotencyConflict("order-42"))
    schema = SchemaNotAtHead("0001", "0002")
    assert "jobqueue migrate" in str(schema) and "0001" in str(schema)


# --- the hierarchy: every error the project defines is a JobqueueError ------------------

PACKAGES = ("jobcore", "jobqueue_api", "jobqueue_worker")
# Errors whose module is another change's to edit; strict, so each mark goes once it is done.
PENDING: dict[str, str] = {}  # errors known not to derive from JobqueueError yet: none


def _modules() -> list[ModuleType]:
    found = []
    for top in PACKAGES:
        package = importlib.import_module(top)
        found.append(package)
        for info in pkgutil.walk_packages(package.__path__, f"{top}."):
            found.append(importlib.import_module(info.name))
    return found


MODULES = _modules()
# Every exception class defined in those packages (by the module that defines it).
ERRORS = sorted(
    {
        value
        for module in MODULES
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == module.__name__
    },
    key=lambda cls: f"{cls.__module__}.{cls.__qualname__}",
)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_the_walk_finds_the_errors_of_every_package():
    found = {_qualified(cls) for cls in ERRORS}
    assert {
        "jobcore.errors.InvalidRequest",
        "jobcore.client.errors.Invalid",
        "jobqueue_api.errors.BodyTooLarge",
        "jobcore.results.ResultError",
    } <= found


@pytest.mark.parametrize(
    "cls",
    [
        pytest.param(
            cls, marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=PENDING[name])
        )
        if (name := _qualified(cls)) in PENDING
        else cls
        for cls in ERRORS
    ],
    ids=_qualified,
)
def test_every_error_the_project_defines_is_a_jobqueue_error(cls: type):
    assert issubclass(cls, JobqueueError)


def test_no_two_errors_share_a_name():
    by_name: dict[str, list[str]] = {}
    for cls in ERRORS:
        by_name.setdefault(cls.__name__, []).append(_qualified(cls))
    assert {name: where for name, where in by_name.items() if len(where) > 1} == {}


def test_an_error_is_known_by_its_own_name_alone():
    aliases = [
        f"{module.__name__}.{name} is {_qualified(value)}"
        for module in MODULES
        for name, value in vars(module).items()
        if inspect.isclass(value) and value in ERRORS and name != value.__name__
    ]
    assert aliases == []


def test_validation_errors_keep_their_builtin_bases():
    """Callers catch them as ValueError (or LookupError, TimeoutError) and go on doing so."""
    assert issubclass(InvalidRequest, ValueError) and InvalidRequest is validation.InvalidRequest
    assert jobcore.InvalidRequest is InvalidRequest
    assert issubclass(client.Invalid, ValueError) and issubclass(client.NotFound, LookupError)
    assert issubclass(client.WaitTimeout, TimeoutError)


async def test_a_prepared_statement_a_pooler_lost_is_described_with_what_to_do(database_url):
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await conn.execute("PREPARE __asyncpg_stmt_7__ AS SELECT 1")
        with pytest.raises(asyncpg.PostgresError) as taken:
            await conn.execute("PREPARE __asyncpg_stmt_7__ AS SELECT 1")
        with pytest.raises(asyncpg.PostgresError) as missing:
            await conn.execute("EXECUTE __asyncpg_stmt_8__")
        with pytest.raises(asyncpg.PostgresError) as other:
            await conn.execute("PREPARE mine AS SELECT 1; PREPARE mine AS SELECT 1")
    finally:
        await conn.close()
    for exc in (taken.value, missing.value):
        assert pooled_statements_lost(exc)
        assert describe(exc).endswith(f"({POOLER_HINT})") and "1.21" in POOLER_HINT
        wrapped = sa_exc.DBAPIError("SELECT 1", None, exc)  # as SQLAlchemy raises it
        assert pooled_statements_lost(wrapped)
    # A statement of the user's own, not asyncpg's: not the pooler's doing.
    assert not pooled_statements_lost(other.value)
    assert POOLER_HINT not in describe(other.value)
