"""The supervisor's `/metrics`: the children's metric files summed, whatever state a child
has left its files in when the scrape comes."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client import generate_latest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.parser import text_string_to_metric_families

from jobqueue_worker import server

NO_CHILDREN = server.Counts(pids=[], restarts=0, stalls=0, recycles=0, abandoned_handlers=0)


def _child_counted(directory: Path, pid: int, value: float) -> None:
    """A child's counter file, as prometheus-client writes it."""
    key = mmap_key("jobs_completed", "jobs_completed_total", [], [], "Jobs completed.")
    written = MmapedDict(str(directory / f"counter_{pid}.db"))
    written.write_value(key, value, 0.0)
    written.close()


def _completed(text: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "jobs_completed_total":
                return sample.value
    raise AssertionError("jobs_completed_total not exported")


def test_a_scrape_sums_the_children_and_skips_a_file_a_child_has_only_just_created(tmp_path):
    _child_counted(tmp_path, 101, 3.0)
    _child_counted(tmp_path, 102, 4.0)
    # A child starting: its file exists, empty, until the child sizes it.
    (tmp_path / "gauge_livemostrecent_103.db").touch()
    (tmp_path / "counter_103.db").touch()
    registry = server.scrape_registry(str(tmp_path), lambda: NO_CHILDREN)
    assert _completed(generate_latest(registry).decode()) == 7.0


async def test_an_endpoint_that_fails_answers_500_in_json_and_logs_the_error(tmp_path, caplog):
    def failing() -> server.Counts:
        raise RuntimeError("children unknown")

    registry = server.scrape_registry(str(tmp_path), failing)

    async def ready() -> tuple[bool, str]:
        return True, "ready"

    app = server.build_app(ready, registry)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
        response = await client.get("/metrics")
    assert response.status_code == 500
    assert response.json() == {"error": "internal error"}
    assert "children unknown" not in response.text
    logged = [r for r in caplog.records if r.name == server.log.name]
    assert logged and logged[0].exc_info and "children unknown" in str(logged[0].exc_info[1])
