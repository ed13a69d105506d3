"""A handler's failure as the job records it (`jobqueue_worker.failures`): an error text and a
traceback PostgreSQL can store, the traceback at most TRACEBACK_LIMIT bytes with its end."""

from __future__ import annotations

import traceback

import pytest

from jobcore.schema import TRACEBACK_LIMIT
from jobqueue_worker.failures import CUT_MARK, cut, error_text, traceback_text


def test_an_error_text_the_database_could_not_store_is_made_storable():
    """A message built from undecodable bytes holds lone surrogates, which the driver
    refuses: the batch holding it would never be written."""
    text = error_text(OSError(b"no such file: \xff\xfe".decode("utf-8", "surrogateescape")))
    text.encode("utf-8")  # storable
    assert "no such file" in text and "\\udcff" in text
    assert "\x00" not in error_text(ValueError("a\x00b"))


def _raises_deep(depth: int) -> None:
    if depth:
        _raises_deep(depth - 1)
    raise ValueError("the key\x00 é")


def test_a_traceback_is_the_formatted_exception_ending_with_the_raising_frame():
    with pytest.raises(ValueError) as info:
        _raises_deep(2)
    text = traceback_text(info.value)
    assert text.startswith("Traceback (most recent call last):")
    lines = text.rstrip("\n").splitlines()
    assert lines[-1] == "ValueError: the key\\x00 é"  # storable: no NUL
    assert 'raise ValueError("the key' in lines[-2]
    assert "in _raises_deep" in lines[-3]


def _fails_while_handling() -> None:
    try:
        raise RuntimeError("the cause " + "x" * TRACEBACK_LIMIT)
    except RuntimeError:
        # The context printed first is what makes the traceback long.
        raise ValueError("the failure")  # noqa: B904


def test_a_traceback_longer_than_the_limit_keeps_its_end_within_the_limit():
    with pytest.raises(ValueError) as info:
        _fails_while_handling()
    whole = "".join(traceback.format_exception(info.value))
    assert len(whole.encode()) > TRACEBACK_LIMIT
    text = traceback_text(info.value)
    assert len(text.encode("utf-8")) <= TRACEBACK_LIMIT
    assert text.startswith(CUT_MARK) and "the cause" not in text
    lines = text.rstrip("\n").splitlines()
    assert lines[-1] == "ValueError: the failure"
    # The raising frame, its line (and the carets Python may add under it), the message.
    assert any(line.endswith("in _fails_while_handling") for line in lines[-4:-1])
    assert whole.endswith(text.removeprefix(CUT_MARK))


@pytest.mark.parametrize("limit", range(20, 28))
def test_a_cut_never_splits_a_character(limit: int):
    text = "start " + "é€😀" * 10 + " end"
    kept = cut(text, limit)
    assert len(kept.encode("utf-8")) <= limit
    assert kept.startswith(CUT_MARK) and kept.endswith(" end")
    assert text.endswith(kept.removeprefix(CUT_MARK))  # whole characters of the end
    assert cut("short", limit) == "short"
