"""jobcore.periodic: cron ticks in UTC, and schedules checked when declared."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

import pytest

import jobcore
from jobcore import periodic as periodic_from_package
from jobcore.errors import ConfigError
from jobcore.periodic import (
    MAX_NAME_LENGTH,
    _schedules,
    check_cron,
    last_tick,
    next_tick,
    periodic,
    schedules,
    tick_text,
)
from jobcore.registry import load_handlers


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.fixture(autouse=True)
def fresh_schedules() -> Iterator[None]:
    saved = dict(_schedules)
    _schedules.clear()
    yield
    _schedules.clear()
    _schedules.update(saved)


# --- ticks -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "moment", "last", "following"),
    [
        ("*/5 * * * *", "2024-01-01 10:07:30", "2024-01-01 10:05:00", "2024-01-01 10:10:00"),
        # Exactly on a tick: that tick is the last one reached, the next is the one after.
        ("*/5 * * * *", "2024-01-01 10:05:00", "2024-01-01 10:05:00", "2024-01-01 10:10:00"),
        ("*/5 * * * *", "2024-01-01 10:04:59.999", "2024-01-01 10:00:00", "2024-01-01 10:05:00"),
        ("*/5 * * * *", "2024-01-01 10:05:00.3", "2024-01-01 10:05:00", "2024-01-01 10:10:00"),
        ("0 0 * * *", "2024-12-31 23:59:59", "2024-12-31 00:00:00", "2025-01-01 00:00:00"),
        ("0 9 * * MON-FRI", "2024-01-06 12:00:00", "2024-01-05 09:00:00", "2024-01-08 09:00:00"),
        ("0 0 29 2 *", "2025-01-01 00:00:00", "2024-02-29 00:00:00", "2028-02-29 00:00:00"),
        ("@hourly", "2024-01-01 10:07:00", "2024-01-01 10:00:00", "2024-01-01 11:00:00"),
        # The seconds extension: the first of six fields.
        ("*/10 * * * * *", "2024-01-01 10:07:35", "2024-01-01 10:07:30", "2024-01-01 10:07:40"),
        ("*/10 * * * * *", "2024-01-01 10:07:30", "2024-01-01 10:07:30", "2024-01-01 10:07:40"),
        ("30 */5 * * * *", "2024-01-01 10:07:00", "2024-01-01 10:05:30", "2024-01-01 10:10:30"),
    ],
)
def test_ticks_at_or_before_and_strictly_after_a_time_in_utc(cron, moment, last, following):
    assert last_tick(cron, at(moment)) == at(last)
    assert next_tick(cron, at(moment)) == at(following)
    assert last_tick(cron, at(moment)).tzinfo is UTC
    assert next_tick(cron, at(moment)).tzinfo is UTC


def test_ticks_are_utc_whatever_the_zone_of_the_time_given():
    paris = timezone(timedelta(hours=1))
    moment = datetime(2024, 1, 1, 9, 30, tzinfo=paris)  # 08:30 UTC
    assert next_tick("0 9 * * *", moment) == at("2024-01-01 09:00:00")
    assert last_tick("0 9 * * *", moment) == at("2023-12-31 09:00:00")


def test_a_time_without_zone_is_refused():
    with pytest.raises(ValueError, match="no time zone"):
        next_tick("* * * * *", datetime(2024, 1, 1))


def test_tick_text_is_second_precision_iso_8601_utc():
    paris = timezone(timedelta(hours=1))
    assert tick_text(datetime(2024, 1, 1, 11, 5, tzinfo=paris)) == "2024-01-01T10:05:00Z"


# --- declaration -------------------------------------------------------------


def test_periodic_is_exported_by_the_package_and_registers_a_schedule():
    assert periodic_from_package is periodic
    assert "periodic" in jobcore.__all__
    declared = periodic(
        "*/5 * * * *",
        "report",
        payload={"scope": "all"},
        queue="reports",
        priority=5,
        name="report-5m",
        max_attempts=2,
        timeout="5m",
    )
    assert schedules() == [declared]
    assert (declared.name, declared.cron, declared.type) == ("report-5m", "*/5 * * * *", "report")
    assert (declared.queue, declared.priority, declared.max_attempts) == ("reports", 5, 2)
    assert declared.timeout == 300.0
    assert declared.key(at("2024-01-01 10:05:00")) == "periodic:report-5m:2024-01-01T10:05:00Z"


def test_defaults_name_from_type_and_normalised_cron_and_payload_empty_object():
    declared = periodic("  */5   *  * * * ", "report")
    assert declared.name == "report */5 * * * *"
    assert declared.cron == "*/5 * * * *"
    assert declared.payload == {}
    # Left out: the handler's options decide, else the global defaults (when submitted).
    assert (declared.queue, declared.priority) == (None, None)
    assert declared.max_attempts is None and declared.timeout is None


def test_the_same_schedule_may_be_declared_again_but_a_name_holds_only_one():
    first = periodic("0 * * * *", "report", payload={"a": 1}, name="hourly")
    assert periodic("0 * * * *", "report", payload={"a": 1}, name="hourly") == first
    with pytest.raises(ValueError, match="'hourly' already holds a different schedule"):
        periodic("0 * * * *", "report", payload={"a": 2}, name="hourly")
    with pytest.raises(ValueError, match="already holds"):
        periodic("30 * * * *", "report", payload={"a": 1}, name="hourly")
    assert schedules() == [first]


def test_default_names_differ_by_cron_and_type():
    periodic("0 * * * *", "report")
    periodic("30 * * * *", "report")
    periodic("0 * * * *", "cleanup")
    assert [s.name for s in schedules()] == [
        "cleanup 0 * * * *",
        "report 0 * * * *",
        "report 30 * * * *",
    ]


def test_the_payload_is_copied_when_declared():
    payload = {"items": [1]}
    declared = periodic("0 * * * *", "report", payload=payload)
    payload["items"].append(2)
    assert declared.payload == {"items": [1]}


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("* * * *", "must have 5 fields"),
        ("* * * * * * *", "must have 5 fields"),
        ("", "must have 5 fields"),
        ("@reboot", "must have 5 fields"),
        ("@every 5m", "must have 5 fields"),
        ("60 * * * *", "is invalid"),
        ("* 24 * * *", "is invalid"),
        ("*/0 * * * *", "is invalid"),
        ("* * * 13 *", "is invalid"),
        ("a b c d e", "is invalid"),
        ("0 0 31 2 *", "is invalid"),  # never fires
        ("H * * * *", "hashed"),
        ("R * * * *", "hashed"),
        ("0 H(0-3) * * *", "hashed"),
    ],
)
def test_a_bad_cron_is_refused_when_declared(cron, message):
    with pytest.raises(ValueError, match=message):
        periodic(cron, "report")
    assert schedules() == []


@pytest.mark.parametrize(
    "cron", ["0 9 * * THU", "0 9 * MAR,APR FRI", "0 0 L * *", "0 0 * * 5#3", "@DAILY", "0 0 * * 7"]
)
def test_names_containing_h_or_r_are_not_taken_for_hashed_forms(cron):
    assert check_cron(cron)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"queue": "Bad Queue"}, "queue"),
        ({"priority": 101}, "priority"),
        ({"priority": True}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 101}, "max_attempts"),
        ({"timeout": "0.5s"}, "timeout"),
        ({"timeout": "25h"}, "timeout"),
        ({"timeout": "soon"}, "timeout"),
        ({"payload": {"at": datetime(2024, 1, 1)}}, "not JSON"),
        ({"payload": float("nan")}, "not JSON"),
        ({"name": ""}, "name"),
        ({"name": " padded"}, "name"),
        ({"name": "tab\there"}, "name"),
        ({"name": "é"}, "name"),
        ({"name": "x" * (MAX_NAME_LENGTH + 1)}, "name"),
    ],
)
def test_bad_fields_are_refused_when_declared(kwargs, message):
    with pytest.raises(ValueError, match=message):
        periodic("0 * * * *", "report", **kwargs)
    assert schedules() == []


def test_a_blank_type_is_refused():
    with pytest.raises(ValueError, match="type"):
        periodic("0 * * * *", " ")


def test_the_longest_name_still_makes_a_valid_key():
    declared = periodic("0 * * * *", "report", name="x" * MAX_NAME_LENGTH)
    assert len(declared.key(at("2024-01-01 10:00:00"))) == 255


def test_a_bad_declaration_in_a_handler_module_is_a_job_handlers_error(tmp_path, monkeypatch):
    (tmp_path / "bad_schedules_module.py").write_text(
        "from jobcore import periodic\nperiodic('61 * * * *', 'report')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        load_handlers(["bad_schedules_module"])
    assert caught.value.variable == "JOB_HANDLERS"
    assert "61 * * * *" in caught.value.message


def test_importing_jobcore_imports_neither_croniter_nor_sqlalchemy():
    # Handler modules and clients import jobcore; only a declared schedule needs croniter.
    code = "import sys, jobcore; print(sorted({'croniter', 'sqlalchemy'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
