"""A JOB_HANDLERS module for tests/e2e/test_worker_periodic.py: one schedule, every two
seconds (the seconds-first extension), of the execution-logging `test.record` handler."""

from __future__ import annotations

from jobcore import periodic

PERIOD_SECONDS = 2
NAME = "e2e-every-2s"

periodic(f"*/{PERIOD_SECONDS} * * * * *", "test.record", payload={"seconds": 0}, name=NAME)
