"""WORKER_SYNCHRONOUS_COMMIT (docs/configuration.md): `on` unless set, `on` or `off` only."""

from __future__ import annotations

import pytest

from jobcore.errors import ConfigError
from jobcore.settings import load_worker_settings


def test_the_worker_commits_synchronously_unless_told_otherwise():
    assert load_worker_settings({}).worker_synchronous_commit == "on"
    assert (
        load_worker_settings({"WORKER_SYNCHRONOUS_COMMIT": " OFF "}).worker_synchronous_commit
        == "off"
    )
    assert (
        load_worker_settings({"WORKER_SYNCHRONOUS_COMMIT": "on"}).worker_synchronous_commit == "on"
    )


@pytest.mark.parametrize("value", ["", "false", "local", "remote_apply", "0"])
def test_any_other_value_is_refused_naming_the_setting_on_one_line(value):
    with pytest.raises(ConfigError) as caught:
        load_worker_settings({"WORKER_SYNCHRONOUS_COMMIT": value})
    assert caught.value.variable == "WORKER_SYNCHRONOUS_COMMIT"
    assert str(caught.value).startswith("WORKER_SYNCHRONOUS_COMMIT: ")
    assert "\n" not in str(caught.value)
