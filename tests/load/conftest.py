"""Load tests run only when selected by marker (`pytest -m load`, as `make load` does), and
their figures are printed at the end and written to chaos-results/load-<timestamp>.json."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.load.report import FIGURES, summary_lines

RESULTS = Path(__file__).resolve().parents[2] / "chaos-results"


def _load_selected(markexpr: str) -> bool:
    words = re.findall(r"\w+", markexpr)
    return any(word == "load" and (i == 0 or words[i - 1] != "not") for i, word in enumerate(words))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _load_selected(config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="load test: select it with -m load (make load)")
    for item in items:
        if item.get_closest_marker("load"):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"load-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(FIGURES, indent=2) + "\n")
    terminalreporter.section("load figures")
    for line in summary_lines(FIGURES):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"written to {path}")
