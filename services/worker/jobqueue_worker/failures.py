"""A handler's failure as the job records it: the error text (`last_error`, and `error` of
its entry in `errors`) and the formatted traceback (the entry's `traceback`,
docs/worker.md#why-a-job-failed).

Both go to PostgreSQL as TEXT in UTF-8, which refuses NUL characters and lone surrogates
(a message built from undecodable bytes): the driver would refuse the whole batch of
outcomes before sending anything, so neither may hold them.
"""

from __future__ import annotations

import traceback

from jobcore.errors import describe
from jobcore.schema import TRACEBACK_LIMIT

# last_error is TEXT, and a huge message helps nobody.
MAX_ERROR = 2000
# What a traceback cut to TRACEBACK_LIMIT starts with, within the limit.
CUT_MARK = "...\n"


def _storable(text: str) -> str:
    text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_text(exc: BaseException, named: bool = True) -> str:
    """`Type: message` (`named`; else the message alone), storable, at most MAX_ERROR
    characters."""
    text = _storable(describe(exc) if named else str(exc))
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 3] + "..."


def traceback_text(exc: BaseException, limit: int = TRACEBACK_LIMIT) -> str:
    """`exc` formatted as Python prints it (`traceback.format_exception`: its chain, the
    frames, the raising one last, then `Type: message`), storable, at most `limit` bytes in
    UTF-8. A longer one keeps its end, where the raising frame and the message are, after
    CUT_MARK, cut on a character boundary."""
    return cut(_storable("".join(traceback.format_exception(exc))), limit)


def cut(text: str, limit: int = TRACEBACK_LIMIT) -> str:
    """`text`, or its end after CUT_MARK, in at most `limit` bytes of UTF-8."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    # The tail may start inside a character: its continuation bytes are dropped.
    tail = data[len(data) - (limit - len(CUT_MARK)) :]
    return CUT_MARK + tail.decode("utf-8", "ignore")
