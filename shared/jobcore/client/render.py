"""Tables for people, for the `jobqueue` command line (rich); the client itself never
imports this module."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import IO, Any

from rich import box
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.status import Status as Spinner
from rich.table import Table
from rich.text import Text

from jobcore.client.records import Job, QueueDepth
from jobcore.states import Status

STYLES = {
    Status.PENDING: "blue",
    Status.PROCESSING: "cyan",
    Status.COMPLETED: "green",
    Status.FAILED: "red",
    Status.DEAD_LETTER: "bold red",
    Status.CANCELLED: "yellow",
}


def _status(status: Status) -> Text:
    return Text(status.value, style=STYLES.get(status, ""))


def _time(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class _Out:
    """Prints to stdout. On a terminal, fitted to its width (rich's: COLUMNS, else the
    terminal's size); anywhere else (a pipe, a file) as wide as what it prints, so nothing is
    cut (`…`) or folded to fit a width no one reads at: not rich's 80 columns, nor the width
    of a terminal that stdin or stderr is (`jobqueue list | less`). Whether stdout is a
    terminal is its own `isatty()`: FORCE_COLOR or TTY_COMPATIBLE, which make rich write
    colours, do not make a pipe narrow."""

    def __init__(self) -> None:
        self.console = Console(highlight=False, soft_wrap=False)
        self.terminal = _isatty(self.console.file)

    def print(self, renderable: RenderableType) -> None:
        console = self.console
        if not self.terminal:
            unbounded = console.options.update_width(sys.maxsize)
            console.width = max(Measurement.get(console, unbounded, renderable).maximum, 1)
        console.print(renderable)


def _isatty(file: IO[str]) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError, OSError):  # closed, or not a real file
        return False


def job(record: Job, note: str | None = None) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    rows: list[tuple[str, str | Text]] = [
        ("id", record.id),
        ("type", record.type),
        ("status", _status(record.status)),
        ("attempts", f"{record.attempts} of {record.max_attempts}"),
        ("queue", record.queue),
        ("priority", str(record.priority)),
        ("timeout", "-" if record.timeout is None else f"{record.timeout:g}s"),
        ("run_at", _time(record.run_at)),
        ("created_at", _time(record.created_at)),
        ("finished_at", _time(record.finished_at)),
        ("payload", _json(record.payload)),
    ]
    if record.concurrency_key is not None:
        rows.insert(6, ("concurrency_key", record.concurrency_key))
    if record.cancel_requested_at is not None:
        rows.append(("cancel asked", _time(record.cancel_requested_at)))
    if record.last_error:
        rows.append(("last_error", Text(record.last_error, style="red")))
    if record.result is not None:
        rows.append(("result", _json(record.result)))
    for name, value in rows:
        table.add_row(name, value)
    out = _Out()
    out.print(table)
    if note:
        out.print(Text(note, style="italic"))


def _short(text: str | None, width: int = 60) -> str:
    if not text:
        return ""
    line = text.splitlines()[0]
    return line if len(line) <= width else line[: width - 1] + "…"


def jobs(records: list[Job], more: bool) -> None:
    out = _Out()
    if not records:
        out.print("no jobs match")
        return
    errors = any(record.last_error for record in records)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("id", no_wrap=True, min_width=36)
    table.add_column("type", no_wrap=True)
    table.add_column("status", no_wrap=True, min_width=11)
    table.add_column("tries", no_wrap=True, justify="right")
    table.add_column("queue", no_wrap=True)
    table.add_column("prio", no_wrap=True, justify="right")
    table.add_column("created (UTC)", no_wrap=True)
    if errors:
        table.add_column("last_error", overflow="ellipsis", no_wrap=True, ratio=1)
    for record in records:
        row: list[str | Text] = [
            record.id,
            record.type,
            _status(record.status),
            f"{record.attempts}/{record.max_attempts}",
            record.queue,
            str(record.priority),
            record.created_at.astimezone(UTC).strftime("%m-%d %H:%M:%S"),
        ]
        if errors:
            row.append(_short(record.last_error, 200))
        table.add_row(*row)
    out.print(table)
    shown = f"{len(records)} job{'s' if len(records) != 1 else ''}"
    out.print(f"{shown}, newest first" + ("; more match (raise --limit)" if more else ""))


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def queues(depths: list[QueueDepth]) -> None:
    out = _Out()
    if not depths:
        out.print("no queue holds jobs")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("queue", no_wrap=True)
    for name in ("pending", "scheduled", "processing", "dead_letter", "oldest pending"):
        table.add_column(name, justify="right")
    table.add_column("paused")
    for depth in depths:
        table.add_row(
            depth.queue,
            str(depth.pending),
            str(depth.scheduled),
            str(depth.processing),
            Text(str(depth.dead_letter), style="red" if depth.dead_letter else ""),
            _age(depth.oldest_pending_age_seconds) if depth.pending else "-",
            Text("paused", style="yellow") if depth.paused else "",
        )
    out.print(table)


class Progress:
    """A status line on stderr while `jobqueue wait` waits: the job's status and attempt."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self._spinner = Spinner(f"waiting for job {job_id}", console=Console(stderr=True))
        self._spinner.start()

    def update(self, record: Job) -> None:
        self._spinner.update(
            f"job {self.job_id}: {record.status.value}, "
            f"attempt {record.attempts} of {record.max_attempts}"
        )

    def stop(self) -> None:
        self._spinner.stop()


def progress(job_id: str) -> Progress:
    return Progress(job_id)
