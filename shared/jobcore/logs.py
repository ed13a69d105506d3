"""JSON logging on stdout: one object per line, with per-task context fields.

`bind(**fields)` attaches fields (e.g. request_id) to every line logged by the
current asyncio task and the tasks it starts.

Hot paths (a worker logs two lines per job) have a cheaper way to the same
lines: `Fields` serialises the fields many lines share once, and `line()`
assembles the JSON object as text and writes it without a LogRecord whenever
the handler `configure()` installed is the only one that would see it
(otherwise the line goes through the logger, with the same fields). `batch()`
holds the lines a thread logs in a block and writes them together at its end.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from json.encoder import encode_basestring_ascii
from typing import Any, TextIO

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "jobqueue_log_context", default=None
)
_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
# One encoder for every line: json.dumps(..., default=str) would build a new one per call.
_ENCODER = json.JSONEncoder(default=str)
# A pipe writes up to PIPE_BUF (4096) bytes whole: lines written together stay under it, so
# lines of processes sharing stdout never interleave. (Lines are ASCII: one char, one byte.)
_WRITE_LIMIT = 4096

# The second-resolution part of the timestamp, formatted once per second, not once per line.
_stamp: tuple[int, str] = (-1, "")
_MILLIS = [f".{ms:03d}Z" for ms in range(1000)]


def _timestamp(created: float) -> str:
    global _stamp
    second = int(created)
    if second != _stamp[0]:
        _stamp = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    # Milliseconds truncated, as LogRecord.msecs are.
    return _stamp[1] + _MILLIS[int((created - second) * 1000)]


def _value(value: Any) -> str:
    """`value` as JSON, as _ENCODER writes it."""
    if type(value) is float and math.isfinite(value):
        return float.__repr__(value)
    return _ENCODER.encode(value)


# Each key as it starts a JSON member ('"key": '), made once per key.
_names: dict[str, str] = {}


def _members(fields: Mapping[str, Any]) -> str:
    """`fields` as the members of a JSON object, without the braces."""
    out = []
    for key, value in fields.items():
        name = _names.get(key)
        if name is None:
            if type(key) is not str:  # the encoder's way with other keys (1 -> "1")
                return _ENCODER.encode(dict(fields))[1:-1]
            name = encode_basestring_ascii(key) + ": "
            if len(_names) < 1000:
                _names[key] = name
        # The common scalars directly; anything else as the encoder writes it.
        kind = type(value)
        if kind is str:
            out.append(name + encode_basestring_ascii(value))
        elif value is None:
            out.append(name + "null")
        elif kind is int:
            out.append(name + int.__repr__(value))
        else:
            out.append(name + _value(value))
    return ", ".join(out)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        context = _context.get()
        if context:
            entry.update(context)
        for key, value in record.__dict__.items():
            if key not in _RESERVED:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return _ENCODER.encode(entry)


class _Held:
    """Lines logged by one thread inside `batch()`, not written yet."""

    __slots__ = ("lines", "output", "thread")

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.lines: list[str] = []
        self.output: _Output | None = None


_held: _Held | None = None


class _Output(logging.StreamHandler[TextIO]):
    """The handler `configure()` installs: each line written (and flushed) when logged,
    unless `batch()` holds it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self.write_line(text)

    def write_line(self, text: str) -> None:
        held = _held
        if held is not None and held.thread == threading.get_ident():
            held.output = self
            held.lines.append(text)
            return
        self.write_lines([text])

    def write_lines(self, lines: list[str]) -> None:
        try:
            with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
                for chunk in _chunks(lines):
                    self.stream.write(chunk)
                    self.stream.flush()
        except Exception:
            self.handleError(logging.makeLogRecord({"msg": lines[0]}))


def _chunks(lines: list[str]) -> Iterator[str]:
    """The lines, newline-terminated, joined into writes of at most _WRITE_LIMIT bytes
    (a longer line goes alone)."""
    start, size = 0, 0
    for i, text in enumerate(lines):
        if size and size + len(text) + 1 > _WRITE_LIMIT:
            yield "\n".join(lines[start:i]) + "\n"
            start, size = i, 0
        size += len(text) + 1
    yield "\n".join(lines[start:]) + "\n"


_output: _Output | None = None
_root = logging.getLogger()


def configure(level: str = "info") -> None:
    global _output
    # Fields no line carries; skipping them saves a stack walk and lookups per record.
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None
    handler = _Output(sys.stdout)
    handler.setFormatter(JsonFormatter())
    _root.handlers[:] = [handler]
    _root.setLevel(level.upper())
    _output = handler
    # Library access logs would be a second, unstructured line per request.
    for noisy in ("hypercorn.access", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@contextmanager
def bind(**fields: Any) -> Iterator[None]:
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def bind_task(**fields: Any) -> None:
    """Like `bind()`, for the rest of the current task (and the tasks it starts): for a task
    that ends with the work the fields describe. A task runs in a copy of the context it
    was created in, so nothing outside it sees them."""
    _context.set({**(_context.get() or {}), **fields})


@contextmanager
def batch() -> Iterator[None]:
    """Hold the lines this thread logs inside the block and write them together when it
    ends: a few writes instead of one per line. The block must not await (lines other
    tasks log meanwhile would wait with it). Nested blocks write with the outermost."""
    global _held
    if _held is not None:
        yield
        return
    held = _held = _Held()
    try:
        yield
    finally:
        _held = None
        if held.lines and held.output is not None:
            held.output.write_lines(held.lines)


class Fields:
    """Fields that several lines carry (e.g. a job's id and type), serialised once for `line()`.

    Like `extra=`, keys must not be LogRecord attributes (msg, name, ...)."""

    __slots__ = ("_json", "values")

    def __init__(self, **values: Any) -> None:
        self.values = values
        self._json = _members(values)


# The JSON of the last context dict seen: bind() makes a new dict per binding, so the
# same dict means the same fields.
_context_json: tuple[dict[str, Any] | None, str] = (None, "")
# What follows the time in a line, up to the msg included, per (logger, level, msg).
_heads: dict[tuple[str, int, str], str] = {}


def line(
    logger: logging.Logger,
    msg: str,
    fields: Fields,
    extra: Mapping[str, Any] | None = None,
    *,
    level: int = logging.INFO,
) -> None:
    """Log `msg` with `fields` and then `extra`: the line `logger.log(level, msg, extra=...)`
    would write, at a fraction of its cost."""
    global _context_json
    if not logger.isEnabledFor(level):
        return
    context = _context.get()
    output = _direct(logger, level)
    if output is None or _overlap(context, fields.values, extra):
        logger.log(level, msg, extra={**fields.values, **(extra or {})})
        return
    head = _heads.get((logger.name, level, msg))
    if head is None:
        head = (
            f'", "level": "{logging.getLevelName(level).lower()}", '
            f'"logger": {encode_basestring_ascii(logger.name)}, '
            f'"msg": {encode_basestring_ascii(msg)}'
        )
        if len(_heads) < 1000:
            _heads[(logger.name, level, msg)] = head
    parts = ['{"time": "', _timestamp(time.time()), head]
    if context:
        cached, members = _context_json
        if cached is not context:
            members = _members(context)
            _context_json = (context, members)
        parts += (", ", members)
    if fields._json:
        parts += (", ", fields._json)
    if extra:
        parts += (", ", _members(extra))
    parts.append("}")
    output.write_line("".join(parts))


def _direct(logger: logging.Logger, level: int) -> _Output | None:
    """configure()'s handler, if it alone would handle a `level` record of `logger`."""
    output = _output
    if output is None or level < output.level or output.filters or _root.filters:
        return None
    handlers = _root.handlers
    if len(handlers) != 1 or handlers[0] is not output:
        return None
    node: logging.Logger | None = logger
    while node is not _root:
        if node is None or node.handlers or node.filters or not node.propagate or node.disabled:
            return None
        node = node.parent
    return output


def _overlap(
    context: dict[str, Any] | None, fields: dict[str, Any], extra: Mapping[str, Any] | None
) -> bool:
    """Whether a key occurs twice; the logger then merges them (the later one wins)."""
    if context:
        for key in context:
            if key in fields or (extra is not None and key in extra):
                return True
    if extra:
        for key in extra:
            if key in fields:
                return True
    return False
