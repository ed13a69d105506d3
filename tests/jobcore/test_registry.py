"""jobcore.registry: handlers register once per type; JOB_HANDLERS modules that cannot be
imported are a configuration error naming the variable."""

from __future__ import annotations

import pytest

from jobcore.errors import ConfigError
from jobcore.registry import get_handler, handler, load_handlers, registered_types


def test_builtin_handlers_are_registered():
    load_handlers([])
    assert {"sleep", "webhook"} <= set(registered_types())


def test_a_type_cannot_be_registered_twice_by_different_functions():
    @handler("test.registry.once")
    async def first(payload, ctx):
        return None

    assert handler("test.registry.once")(first).fn is first.fn  # the same function again is fine
    assert get_handler("test.registry.once") is first.fn
    with pytest.raises(ValueError, match="already registered"):

        @handler("test.registry.once")
        async def second(payload, ctx):
            return None


@pytest.mark.parametrize("job_type", ["", "   "])
def test_a_blank_type_is_refused(job_type):
    with pytest.raises(ValueError):
        handler(job_type)


def test_a_handler_module_that_cannot_be_imported_names_job_handlers():
    with pytest.raises(ConfigError) as caught:
        load_handlers(["tests.no_such_module_here"])
    assert caught.value.variable == "JOB_HANDLERS"
    assert "tests.no_such_module_here" in str(caught.value)
