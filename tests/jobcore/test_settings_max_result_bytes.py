"""MAX_RESULT_BYTES (docs/configuration.md): 65536 by default, from 1 byte to 16 MiB; anything
else stops the service with one line naming the variable."""

import pytest

from jobcore.errors import ConfigError
from jobcore.settings import MAX_RESULT_BYTES_LIMIT, load_worker_settings


def test_the_default_is_64_kib_and_the_range_is_1_byte_to_16_mib():
    assert load_worker_settings({}).max_result_bytes == 65_536
    assert MAX_RESULT_BYTES_LIMIT == 16 * 1024 * 1024
    for value in ("1", "1000", str(MAX_RESULT_BYTES_LIMIT), " 42 "):
        assert load_worker_settings({"MAX_RESULT_BYTES": value}).max_result_bytes == int(value)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("0", "greater than or equal to 1"),
        ("-1", "greater than or equal to 1"),
        (str(MAX_RESULT_BYTES_LIMIT + 1), f"less than or equal to {MAX_RESULT_BYTES_LIMIT}"),
        ("64k", "valid integer"),
        ("1e3", "valid integer"),
        ("", "valid integer"),
    ],
)
def test_a_bad_max_result_bytes_names_the_variable_in_one_line(value, says):
    with pytest.raises(ConfigError) as caught:
        load_worker_settings({"MAX_RESULT_BYTES": value})
    assert caught.value.variable == "MAX_RESULT_BYTES"
    assert str(caught.value).startswith("MAX_RESULT_BYTES: ")
    assert says in str(caught.value) and "\n" not in str(caught.value)
