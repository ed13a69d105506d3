"""A one-line progress bar on stderr: steps done, the current step, elapsed time."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, stream: TextIO | None = None, width: int = 30) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream or sys.stderr
        self.width = width
        self.started = time.monotonic()
        self._tty = self.stream.isatty()

    def step(self, label: str) -> None:
        """Announce the step now starting."""
        self._draw(label)

    def advance(self) -> None:
        self.done = min(self.done + 1, self.total)

    def close(self) -> None:
        self._draw("done")
        if self._tty:
            self.stream.write("\n")
        self.stream.flush()

    def _draw(self, label: str) -> None:
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.monotonic() - self.started
        line = f"[{bar}] {self.done}/{self.total} {elapsed:6.0f}s  {label}"
        if self._tty:
            # Pad so a shorter label fully overwrites the previous one.
            self.stream.write("\r" + line.ljust(110)[:110])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
