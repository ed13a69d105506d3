"""Results with the real `jobqueue-worker`: what a handler returns is the job's `result`; a
value that is not JSON, or over MAX_RESULT_BYTES, fails the job at once, saying why."""

from __future__ import annotations

import pytest

from tests.worker.support import all_in, eventually, fetch, read_log, start_worker, submit

pytestmark = pytest.mark.e2e


async def test_a_handler_return_value_is_stored_as_the_job_result(database_url, engine, tmp_path):
    value = {"rows": [1, 2.5, None, True], "name": "é😀", "nested": {"a": []}}
    (returns,) = await submit(engine, "test.returns", {"value": value})
    (nothing,) = await submit(engine, "test.returns", {})
    (text,) = await submit(engine, "test.returns", {"chars": 98})  # 100 bytes with its quotes
    (too_big,) = await submit(engine, "test.returns", {"chars": 99}, max_attempts=5)
    (not_json,) = await submit(engine, "test.returns", {"unserialisable": True}, max_attempts=5)
    worker = start_worker(database_url, tmp_path, MAX_RESULT_BYTES="100")
    try:
        done = [returns, nothing, text]
        await eventually(lambda: all_in(engine, done, "completed"), 60, "completed")
        await eventually(lambda: all_in(engine, [too_big, not_json], "failed"), 60, "failed")
        found = await fetch(engine, [*done, too_big, not_json])
        assert found[returns].result == value
        assert found[nothing].result is None
        assert found[text].result == "x" * 98
        assert found[too_big].last_error == "result is 101 bytes, over MAX_RESULT_BYTES=100"
        assert found[not_json].last_error == (
            "result is not JSON-serialisable: Object of type complex is not JSON serializable"
        )
        for job_id in (too_big, not_json):
            assert found[job_id].attempts == 1 and found[job_id].result is None
            runs = [row for row in read_log(worker.exec_log) if row[1] == str(job_id)]
            assert len(runs) == 1  # failed for good: not retried
        finished = {line["job_id"]: line for line in worker.messages("job finished")}
        assert finished[str(too_big)]["outcome"] == "failed"
        assert "MAX_RESULT_BYTES" in finished[str(too_big)]["error"]
    finally:
        assert worker.stop(60) == 0


@pytest.mark.parametrize("value", ["0", "17000000", "64k"])
def test_a_bad_max_result_bytes_exits_2_with_one_line_naming_it(database_url, tmp_path, value):
    worker = start_worker(database_url, tmp_path, MAX_RESULT_BYTES=value)
    assert worker.wait(60) == 2
    (line,) = worker.logs()
    assert line["level"] == "error" and line["variable"] == "MAX_RESULT_BYTES"
