"""What a benchmark step run on its own (`python -m bench.<step>`) prints, and the phrases
its table shares with the others."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def outages(n: int) -> str:
    """The note a figure carries when the worker lost its database during it."""
    return f"; the worker lost its database {n} time(s): VOID" if n else ""


def report(
    section: dict[str, Any],
    lines: Callable[[dict[str, Any]], list[str]],
    targets: Callable[[dict[str, Any]], list[dict[str, Any]]],
) -> int:
    """Print the step's table (without its heading) and its targets; 0 if every one is met."""
    print("\n".join(lines(section)[1:]))
    checked = targets(section)
    for target in checked:
        verdict = "met" if target["met"] else "MISSED"
        measured = target["measured"]
        shown = f"{measured:.2f}" if isinstance(measured, float) else measured
        print(f"[{verdict}] {target['target']} {target['goal']}: {shown}")
    return 0 if all(t["met"] for t in checked) else 1
