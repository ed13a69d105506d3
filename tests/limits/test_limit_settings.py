"""TYPE_CONCURRENCY, TYPE_RATE and KEY_CONCURRENCY: parsed once at startup; a bad value stops
the worker with exit status 2 and one line naming the variable."""

from __future__ import annotations

import pytest

from jobcore.errors import ConfigError
from jobcore.settings import load_worker_settings
from jobcore.settings.parsing import key_limits_of
from tests.worker.support import start_worker


def test_limits_are_parsed_per_type():
    settings = load_worker_settings(
        {"TYPE_CONCURRENCY": "webhook:10, report:1", "TYPE_RATE": "webhook:50/s,mail:600/m"}
    )
    assert settings.type_concurrency == {"webhook": 10, "report": 1}
    assert settings.type_rate == {"webhook": (50, 1.0), "mail": (600, 60.0)}


def test_no_limits_by_default():
    settings = load_worker_settings({})
    assert settings.type_concurrency == {}
    assert settings.type_rate == {}


def test_key_limits_are_parsed_per_queue_with_a_default_for_the_others():
    settings = load_worker_settings({"KEY_CONCURRENCY": "reports:1, *:2"})
    assert settings.key_concurrency == {"reports": 1, "*": 2}
    assert key_limits_of(settings.key_concurrency, ["reports", "default"]) == {
        "reports": 1,
        "default": 2,
    }
    assert key_limits_of({"reports": 1}, ["reports", "default"]) == {"reports": 1}
    assert load_worker_settings({}).key_concurrency == {}


def test_a_type_name_may_hold_dots_and_colons():
    settings = load_worker_settings({"TYPE_CONCURRENCY": "test.record:2,a:b:3"})
    assert settings.type_concurrency == {"test.record": 2, "a:b": 3}


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TYPE_CONCURRENCY", "webhook"),
        ("TYPE_CONCURRENCY", "webhook:0"),
        ("TYPE_CONCURRENCY", "webhook:-1"),
        ("TYPE_CONCURRENCY", "webhook:ten"),
        ("TYPE_CONCURRENCY", "webhook:99999999"),
        ("TYPE_CONCURRENCY", ":3"),
        ("TYPE_CONCURRENCY", "a:1,a:2"),
        ("TYPE_CONCURRENCY", "a:1,"),
        ("TYPE_RATE", "webhook:50"),
        ("TYPE_RATE", "webhook:50/h"),
        ("TYPE_RATE", "webhook:0/s"),
        ("TYPE_RATE", "webhook:/s"),
        ("TYPE_RATE", "mail:1/m,mail:2/s"),
        ("TYPE_RATE", "my type:1/s"),
        ("KEY_CONCURRENCY", "default"),
        ("KEY_CONCURRENCY", "default:0"),
        ("KEY_CONCURRENCY", "Default:2"),
        ("KEY_CONCURRENCY", "*:1,*:2"),
        ("KEY_CONCURRENCY", ":2"),
        ("KEY_CONCURRENCY", "default:two"),
    ],
)
def test_an_invalid_limit_names_its_variable(variable, value):
    with pytest.raises(ConfigError) as caught:
        load_worker_settings({variable: value})
    assert caught.value.variable == variable


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"TYPE_CONCURRENCY": "webhook:0"}, "TYPE_CONCURRENCY"),
        ({"TYPE_RATE": "mail:5"}, "TYPE_RATE"),
        ({"KEY_CONCURRENCY": "*:0"}, "KEY_CONCURRENCY"),
    ],
)
def test_a_worker_with_an_invalid_limit_exits_2_with_one_line(
    database_url, tmp_path, env, variable
):
    worker = start_worker(database_url, tmp_path, **env)
    assert worker.wait(60) == 2
    (line,) = worker.logs()
    assert line["level"] == "error" and line["variable"] == variable
