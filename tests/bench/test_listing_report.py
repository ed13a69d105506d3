"""The listing step's arithmetic: the worst page p99 against the 20 ms target, the table."""

from __future__ import annotations

from typing import Any

from bench import listing
from bench.queues import parse_args, total_steps
from bench.report import render, summarize
from tests.bench.test_report import target_line


def listing_row(rows: int, p99: dict[tuple[str, str], float]) -> dict[str, Any]:
    combos = {
        name: {
            "indexes": ["jobs_status_idx"],
            **{
                page: {"p50_ms": 1.0, "p99_ms": p99.get((name, page), 2.0), "samples": 200}
                for page in listing.PAGES
            },
        }
        for name in listing.COMBOS
    }
    return {
        "kind": "listing",
        "rows": rows,
        "limit": 50,
        "fill_seconds": 30.0,
        "combos": combos,
        "queue_depths": {"p50_ms": 3.0, "p99_ms": 6.0, "samples": 200},
        "statuses": {"completed": rows},
    }


def document(results: list[dict[str, Any]]) -> dict[str, Any]:
    doc = {
        "config": {"workers": 50, "repeat": 1, "batch_concurrency": 4, "jobs": 1000},
        "results": results,
        "errors": [],
        "systems": {},
        "machine": {"cpus": 2, "postgresql": "15"},
    }
    doc["summary"] = summarize(doc)
    return doc


def test_the_listing_target_is_the_worst_page_p99_under_20_ms() -> None:
    slow = ("type=report&queue=critical", "deep")
    doc = document([listing_row(1_000_000, {slow: 19.5})])
    section = doc["summary"]["listing"]
    assert section["worst_p99_ms"] == 19.5
    assert section["worst"] == "type=report&queue=critical (deep page)"
    (target,) = [t for t in doc["summary"]["targets"] if t["target"].startswith("list page")]
    assert target["met"] and target["goal"] == "< 20"
    missed = document([listing_row(1_000_000, {slow: 20.0})])
    name = "list page of 50 p99, every filter, first and deep page, 1,000,000 jobs (ms)"
    assert target_line(render(missed), name) == ["MISSED", name, "< 20", "20.00"]


def test_a_smaller_table_says_the_target_is_stated_for_a_million_rows() -> None:
    text = render(document([listing_row(3000, {})]))
    name = "list page of 50 p99, every filter, first and deep page, 3,000 jobs (ms)"
    assert target_line(text, name) == ["met", name, "< 20 (stated for 1,000,000)", "2.00"]
    assert "Listing: 3,000 jobs, pages of 50" in text
    assert "  queue_depths: p50 3.00 ms, p99 6.00 ms" in text
    assert "status=failed&type=report&queue=critical" in text


def test_list_rows_zero_skips_the_listing_step() -> None:
    config = parse_args(["--quick", "--server", "postgresql://unused"])
    skipped = parse_args(["--quick", "--list-rows", "0", "--server", "postgresql://unused"])
    assert (config.list_rows, skipped.list_rows) == (100_000, 0)
    assert total_steps(config) - total_steps(skipped) == 1
    assert "listing" not in document([])["summary"]
