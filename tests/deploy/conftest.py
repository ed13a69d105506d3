"""Fixtures for the deployment files: rendered charts, the resolved compose model, and what
the real services export."""

from __future__ import annotations

from typing import Any

import pytest

from tests import pg
from tests.deploy import live
from tests.deploy.script import validate_deploy


@pytest.fixture(scope="session")
def default_manifests() -> list[dict[str, Any]]:
    return validate_deploy.render_chart()


@pytest.fixture(scope="session")
def production_manifests() -> list[dict[str, Any]]:
    return validate_deploy.render_chart(validate_deploy.production_values())


@pytest.fixture(scope="session")
def compose() -> dict[str, Any]:
    return validate_deploy.compose_config()


@pytest.fixture(scope="session")
def live_scrape(
    pg_server: str, pg_template: str, tmp_path_factory: pytest.TempPathFactory
) -> live.Scrape:
    """Both services' /metrics after a real API and worker ran jobs to every end; tests that
    use it share one run (mark them `xdist_group("live_metrics")`)."""
    name = pg.create_database(pg_server, pg_template)
    try:
        return live.scrape(pg.with_database(pg_server, name), tmp_path_factory.mktemp("live"))
    finally:
        pg.drop_database(pg_server, name)
