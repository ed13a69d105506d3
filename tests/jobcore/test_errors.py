"""jobcore.errors: typed errors carry what an operator needs; describe() names the type."""

from __future__ import annotations

from jobcore.errors import ConfigError, IdempotencyConflict, SchemaNotAtHead, describe


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
    assert "alembic upgrade head" in str(schema) and "0001" in str(schema)
