"""RETENTION_RATE (docs/configuration.md): 5,000 jobs/s by default, from 100 to 1,000,000;
anything else stops the service with one line naming the variable."""

import pytest

from jobcore.errors import ConfigError
from jobcore.settings import load_worker_settings


def test_the_default_is_5000_jobs_per_second_and_the_range_is_100_to_a_million():
    assert load_worker_settings({}).retention_rate == 5_000
    for value in ("100", "20000", "1000000"):
        assert load_worker_settings({"RETENTION_RATE": value}).retention_rate == int(value)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("99", "greater than or equal to 100"),
        ("0", "greater than or equal to 100"),
        ("1000001", "less than or equal to 1000000"),
        ("5k", "valid integer"),
    ],
)
def test_a_bad_retention_rate_names_the_variable_in_one_line(value, says):
    with pytest.raises(ConfigError) as caught:
        load_worker_settings({"RETENTION_RATE": value})
    assert caught.value.variable == "RETENTION_RATE"
    assert str(caught.value).startswith("RETENTION_RATE: ")
    assert says in str(caught.value) and "\n" not in str(caught.value)
